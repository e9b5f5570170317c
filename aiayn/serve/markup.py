"""HTML for `format=html`: the text between the tags is translated, everything else is kept.

The page is read by Python's HTML parser (html.parser, the tokenizer of the HTML standard's
shape, lenient with malformed markup as browsers are), each construct once in a loop of our own
(`_Pieces.goahead`), into pieces: markup (tags with their attributes, comments, declarations,
and the whole content of <script>, <style> and <code>), kept byte for byte except that end
tags are written in lower case, and text: its sentences translated, with their entities
decoded and encoded again, and the text around them (its leading and trailing whitespace, what
lies between sentences) kept as written. Text without a letter (a number, the "." after a
closing tag) is kept as it is (`sentences.has_words`).
"""

from __future__ import annotations

import html
import itertools
import re
from html.parser import HTMLParser
from typing import Optional

from aiayn.sentences import has_words, interleave, split_sentences

# Content that is code, not prose; and <pre> and <textarea>, whose spaces and line breaks are the
# content (found in review: a <pre>'s lines were joined into one sentence), and the old forms of
# both a browser still reads so, <xmp>, <listing> and <plaintext> (found by a misuse hunt).
UNTRANSLATED = frozenset({"script", "style", "code", "kbd", "samp", "var", "pre", "textarea", "xmp", "listing",
                          "plaintext"})
# Where the HTML standard ends a comment: "-->", and "--!>" (an incorrectly closed comment).
_COMMENT_END = re.compile(r"--!?>")
# A character reference, as html.unescape finds them (its module's own pattern).
_CHARREF = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)")
_LESS_THAN = re.compile("<")
_TAG_OPEN = re.compile("<[a-zA-Z]")  # a start tag's "<", as the HTML standard's tag open state reads it


class _Pieces(HTMLParser):
    """The page, fed whole and once, read construct by construct with the parser's own readers
    of tags, comments and declarations; text, references and all, is read as written."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.pieces: list[tuple[bool, str]] = []  # (is text, raw source)
        self.inside = 0  # depth in UNTRANSLATED elements

    def goahead(self, end: bool) -> None:
        """The parser's loop, each construct read once, so that the time grows with the page.
        Python 3.11's loop read a construct never closed again from each later "<" (a 200 KB page
        of "<a" took 18 s of the server's CPU; found by a misuse hunt), and after a second "&#"
        that began no reference took the rest of the page, tags and all, as text. A construct
        never closed is markup up to the next ">", or to the end of the page (a browser shows
        none of it); what is left in the parser is the content of a <script> or <style> never
        closed, which `close` keeps."""
        raw, i = self.rawdata, 0
        while i < len(raw):
            found = (self.interesting if self.cdata_elem else _LESS_THAN).search(raw, i)
            if found is None and self.cdata_elem:
                break
            j = found.start() if found else len(raw)
            if i < j:
                self.handle_data(raw[i:j])
            i = self.updatepos(i, j)
            if i < len(raw):
                k = self._construct(i)
                if k < 0:
                    k = raw.find(">", i + 1) + 1 or len(raw)
                    self._markup(raw[i:k])
                i = self.updatepos(i, k)
        self.rawdata = raw[i:]

    def _construct(self, i: int) -> int:
        """The construct at `i`, a "<", read by the parser's reader for it; where it ends (-1:
        never closed)."""
        raw = self.rawdata
        if _TAG_OPEN.match(raw, i):
            return self.parse_starttag(i)
        for opening, read in (("</", self.parse_endtag), ("<!--", self.parse_comment), ("<?", self.parse_pi),
                              ("<!", self.parse_html_declaration)):
            if raw.startswith(opening, i):
                return read(i)
        self.handle_data("<")  # "<" before a space, a digit, ...: text
        return i + 1

    def close(self) -> None:
        """The end of the page. What the parser still holds is markup: the content of a <script>
        or <style> never closed, which Python 3.11's parser dropped (found in review: the rest of
        the page went with it)."""
        super().close()
        if self.rawdata:
            self._markup(self.rawdata)
            self.rawdata = ""

    def parse_comment(self, i, report=1):
        """A comment as a browser reads it, kept as markup: up to "-->" or "--!>"; "<!-->" and
        "<!--->", which end at once; one never closed runs to the end of the page. Python 3.11's
        parser knew only "-->", and gave the others to translate as text (found in review: a
        hidden note came back translated and shown)."""
        rawdata = self.rawdata
        abrupt = next((len(form) for form in ("<!-->", "<!--->") if rawdata.startswith(form, i)), None)
        match = _COMMENT_END.search(rawdata, i + 4)
        end = i + abrupt if abrupt else match.end() if match else len(rawdata)
        self._markup(rawdata[i:end])
        return end

    def _markup(self, raw: str) -> None:
        self.pieces.append((False, raw))

    def _text(self, raw: str) -> None:
        if self.inside:
            return self._markup(raw)
        self.pieces.append((True, raw))  # joined to the text beside it by `split_html`

    def handle_starttag(self, tag, attrs) -> None:
        self._markup(self.get_starttag_text())
        self.inside += tag in UNTRANSLATED

    def handle_startendtag(self, tag, attrs) -> None:
        """`<code/>`: HTML has no self-closing elements but the void ones (<br/>), so a browser
        opens a <code> there (found by a misuse hunt: the code after it was translated)."""
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag) -> None:
        self.inside -= tag in UNTRANSLATED and self.inside > 0
        self._markup(f"</{tag}>")

    def handle_data(self, data) -> None:
        self._text(data)

    def parse_endtag(self, i):
        """`</ p>`: a "</" and a space open no end tag but a bogus comment, as a browser reads it
        (Python's parser made it `</p>`, a real end tag)."""
        if self.rawdata[i + 2:i + 3].isspace():
            return self.parse_bogus_comment(i)
        return super().parse_endtag(i)

    def parse_bogus_comment(self, i, report=1):
        """`<!x>`, `</ p>` and the like, which a browser reads as comments: kept as written (they
        were rewritten as `<!--x-->`, `</p>`, the last a real end tag; found in review)."""
        end = self.rawdata.find(">", i + 2) + 1 or len(self.rawdata)
        self._markup(self.rawdata[i:end])
        return end

    def handle_decl(self, decl) -> None:
        self._markup(f"<!{decl}>")

    def handle_pi(self, data) -> None:
        self._markup(f"<?{data}>")

    def parse_marked_section(self, i, report=1):
        """`<![CDATA[...]]>`, `<![if ...]>` and the like, kept as written. Python 3.11's parser
        raises AssertionError for a keyword it does not know (`<![foo[`): such a section is what
        a browser reads it as, a bogus comment up to the next `>`."""
        try:
            end = super().parse_marked_section(i, report=0)
        except AssertionError:
            end = self.rawdata.find(">", i)
            end = end + 1 if end >= 0 else -1
        if end >= 0:
            self._markup(self.rawdata[i:end])
        return end

    def unknown_decl(self, data) -> None:  # the marked sections of parsers that do not call the above
        self._markup(f"<![{data}]]>" if data.upper().startswith("CDATA[") else f"<![{data}]>")


def _decoded(raw: str) -> tuple[str, list[int]]:
    """(`html.unescape(raw)`, where each of its offsets lies in `raw`, one more for its end): the
    characters a reference decodes to all lie at the reference's start."""
    text, where, at = [], [], 0
    for match in [*_CHARREF.finditer(raw), None]:
        end = match.start() if match else len(raw)
        text.append(raw[at:end])
        where.extend(range(at, end))
        if match:
            written = match.group()
            decoded = html.unescape(written)
            # What unescape keeps as written (no reference at all, or the tail after a named
            # one's longest known prefix: "&notit;" is "¬it;") lies where it was written (found
            # in review: all of "&6.\r\n" lay at its "&", and text was doubled or lost).
            # (k = 0 always matches; a reference to nothing, "&#x1", decodes to "": found by fuzzing)
            kept = len(written) if decoded == written else next(k for k in range(
                max(min(len(decoded), len(written)) - 1, 0), -1, -1) if written.endswith(decoded[len(decoded) - k:]))
            text.append(decoded)
            where.extend([match.start()] * (len(decoded) - kept) + list(range(match.end() - kept, match.end())))
            at = match.end()
    return "".join(text), where + [len(raw)]


def split_html(page: str, lang: Optional[str] = None) -> tuple[list[str], list[str]]:
    """(the texts to translate, the page's other pieces around them): the page is
    `rest[0] + texts[0] + rest[1] + ... + texts[-1] + rest[-1]` once the texts are encoded again,
    and `join_html(translations, rest)` builds the translated page. With `lang`, a text between
    tags is split into its sentences too (aiayn.sentences, rules for `lang`), as format=text is:
    a paragraph is no one sequence (found in review: a <p> of 12 verses passed the token limit)."""
    parser = _Pieces()
    parser.feed(page)
    parser.close()
    texts, rest, kept = [], [], ""
    for is_text, run in itertools.groupby(parser.pieces, key=lambda piece: piece[0]):
        raw = "".join(piece for _, piece in run)  # a text of several pieces ("a < b"), once
        if not (is_text and has_words(html.unescape(raw))):  # markup, or text with nothing to translate
            kept += raw
            continue
        lead, trail, body = raw[: len(raw) - len(raw.lstrip())], raw[len(raw.rstrip()):], raw.strip()
        text, where = _decoded(body)
        # A line break in a page's text is a space (found in review: hard-wrapped paragraphs were cut)
        sentences, between = split_sentences(text, lang, lines=False) if lang else ([text], ["", ""])
        # The text between the sentences as the page wrote it, entities and all (found in review:
        # `&nbsp;` came back as a raw no-break space)
        spans, at = [], 0
        for part, sentence in zip(between, [*sentences, ""]):
            spans.append((at, at + len(part)))
            at += len(part) + len(sentence)
        between = [body[where[start]:where[end]] for start, end in spans]
        rest += [kept + lead + between[0], *between[1:-1]]
        texts += [" ".join(sentence.split()) for sentence in sentences]  # HTML's runs of whitespace are one space
        kept = between[-1] + trail
    rest.append(kept)
    return texts, rest


def join_html(translations: list[str], rest: list[str]) -> str:
    """The page of `split_html` with its texts replaced by `translations`, encoded for HTML."""
    return interleave([html.escape(text, quote=False) for text in translations], rest)
