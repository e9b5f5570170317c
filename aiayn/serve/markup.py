"""HTML for `format=html`: the text between the tags is translated, everything else is kept.

The page is read by Python's HTML parser (html.parser, the tokenizer of the HTML standard's
shape, lenient with malformed markup as browsers are) into pieces: markup (tags with their
attributes, comments, declarations, and the whole content of <script>, <style> and <code>),
kept byte for byte except that end tags are written in lower case, and text: its sentences
translated, with their entities decoded and encoded again, and the text around them (its
leading and trailing whitespace, what lies between sentences) kept as written. Text without a
letter (a number, the "." after a closing tag) is kept as it is (`sentences.has_words`).
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from typing import Optional

from aiayn.sentences import has_words, interleave, split_sentences

# Content that is code, not prose; and <pre> and <textarea>, whose spaces and line breaks are the
# content (found in review: a <pre>'s lines were joined into one sentence).
UNTRANSLATED = frozenset({"script", "style", "code", "kbd", "samp", "var", "pre", "textarea"})
# Where the HTML standard ends a comment: "-->", and "--!>" (an incorrectly closed comment).
_COMMENT_END = re.compile(r"--!?>")
# A character reference, as html.unescape finds them (its module's own pattern).
_CHARREF = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)")


class _Pieces(HTMLParser):
    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=False)
        self.page = page  # fed whole, once: a reference is read back from it as written
        self.line_starts = [0, *(i + 1 for i, c in enumerate(page) if c == "\n")]
        self.pieces: list[tuple[bool, str]] = []  # (is text, raw source)
        self.inside = 0  # depth in UNTRANSLATED elements
        self.closing = False  # the whole page has been fed

    def close(self) -> None:
        """The end of the page. What the parser still holds is markup: the content of a <script>
        or <style> never closed, which Python 3.11's parser dropped (found in review: the rest of
        the page went with it)."""
        self.closing = True
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
        end = i + abrupt if abrupt else match.end() if match else len(rawdata) if self.closing else -1
        if end >= 0:
            self._markup(rawdata[i:end])
        return end

    def _markup(self, raw: str) -> None:
        self.pieces.append((False, raw))

    def _text(self, raw: str) -> None:
        if self.inside:
            return self._markup(raw)
        if self.pieces and self.pieces[-1][0]:  # text continued after an entity
            self.pieces[-1] = (True, self.pieces[-1][1] + raw)
        else:
            self.pieces.append((True, raw))

    def handle_starttag(self, tag, attrs) -> None:
        self._markup(self.get_starttag_text())
        self.inside += tag in UNTRANSLATED

    def handle_startendtag(self, tag, attrs) -> None:
        self._markup(self.get_starttag_text())

    def handle_endtag(self, tag) -> None:
        self.inside -= tag in UNTRANSLATED and self.inside > 0
        self._markup(f"</{tag}>")

    def handle_data(self, data) -> None:
        self._text(data)

    def handle_entityref(self, name) -> None:
        self._reference(f"&{name}")

    def handle_charref(self, name) -> None:
        self._reference(f"&#{name}")

    def _reference(self, written: str) -> None:
        """A character reference as the page wrote it, with its ";" only where it had one (found
        in review: "Q&A session" became "Q&A; session"). The parser reports where it stands as
        (line, column), lines ended by "\n", as the page was fed."""
        line, column = self.getpos()
        at = self.line_starts[line - 1] + column
        self._text(written + ";" if self.page.startswith(written + ";", at) or not self.page.startswith(written, at)
                   else written)

    def parse_endtag(self, i):
        """`</ p>`: a "</" and a space open no end tag but a bogus comment, as a browser reads it
        (Python's parser made it `</p>`, a real end tag)."""
        if self.rawdata[i + 2:i + 3].isspace():
            return self.parse_bogus_comment(i)
        return super().parse_endtag(i)

    def parse_bogus_comment(self, i, report=1):
        """`<!x>`, `</ p>` and the like, which a browser reads as comments: kept as written (they
        were rewritten as `<!--x-->`, `</p>`, the last a real end tag; found in review)."""
        end = self.rawdata.find(">", i + 2)
        end = end + 1 if end >= 0 else len(self.rawdata) if self.closing else -1
        if end >= 0:
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
            kept = len(written) if decoded == written else next(  # (k = 0 always matches)
                k for k in range(min(len(decoded), len(written)) - 1, -1, -1) if written.endswith(decoded[len(decoded) - k:]))
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
    parser = _Pieces(page)
    parser.feed(page)
    parser.close()
    texts, rest, kept = [], [], ""
    for is_text, raw in parser.pieces:
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
