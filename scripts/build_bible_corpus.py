#!/usr/bin/env python3
"""Rebuild the built-in parallel corpus ``aiayn/corpora/bible-en-es.tsv.xz``.

Sources (both public domain, read from locally installed SWORD modules):

* English: World English Bible, SWORD module ``engWEB2015eb``
  (Debian package ``sword-text-web``).
* Spanish: Reina-Valera 1909, SWORD module ``spaRV1909eb``
  (Debian package ``sword-text-sparv``).

Reader: the pure-Python ``pysword`` package (tested with pysword 0.2.8); the
rest is Python 3.11 standard library.  No network access is needed once the
packages are installed.

How to run (from the repository root)::

    apt-get update
    apt-get install -y sword-text-web sword-text-sparv   # installs to /usr/share/sword
    python -m pip install pysword==0.2.8
    python scripts/build_bible_corpus.py                  # writes the .tsv.xz

Options: ``--sword-path`` (default ``/usr/share/sword``), ``--out`` (default
``aiayn/corpora/bible-en-es.tsv.xz`` next to this script's repository),
``--samples N`` (random pairs printed per split, default 5), ``--seed`` (for
the printed samples only; the output file does not depend on it),
``--verbose`` (list every dropped reference and every text fix).

Output: xz-compressed (preset 9) UTF-8 TSV with header ``split ref en es``,
one line per aligned verse, in canonical (KJV) book order.  ``ref`` is
``<OSIS book id> <chapter>:<verse>``, e.g. ``Gen 1:1``, ``Ps 23:1``,
``3John 1:14``.  The script is deterministic: the same modules give a
byte-identical file.

What it does (details in ``aiayn/corpora/README.md``):

1. Reads every verse of the 66 protocanonical books from both modules,
   keyed by (book, chapter, verse).  WEB uses NRSVA versification
   (deuterocanonical books are dropped: not in RV1909), RV1909 uses KJV.
2. Cleans the OSIS markup: drops footnotes and cross references (with their
   text), Strong's numbers / morphology (attributes of ``<w>``), speaker
   labels, non-canonical titles and anything after a chapter's end marker
   (WEB appends its glossary to Rev 22:21); keeps canonical psalm
   superscriptions (RV1909 has them inline in verse 1 too).  A removed
   element or a block boundary between two words becomes one space; inline
   tags (``<w>``, ``<q>``, ...) vanish.  RV1909 ``<transChange>`` (supplied
   words) boundaries become a space, except for an enclitic pronoun split off
   a verb (``sáca`` + ``lo`` -> ``sácalo``).  Then NFC, single spaces, strip.
3. RV1909 fixes: removes the Pauline subscriptions ("Fué escrita de
   Corinto ...") after the final "Amén." of Romans..Hebrews, and undoes the
   all-capitals drop-cap of the first word(s) of each chapter
   ("EN el principio" -> "En el principio", "A JEHOVÁ" -> "A Jehová"),
   choosing each word's case from its most frequent spelling elsewhere.
4. Alignment: strictly on the same reference, never re-pairing verses.
   Drops references present in only one module; references empty on either
   side; the neighbours (same chapter) of a reference that is empty on
   exactly one side (its text was merged into a neighbour); and verses
   flagged by a lexical alignment check built from the corpus itself
   (Dice-coefficient word translations): runs of verses whose text matches
   a verse 1-5 positions away better than its own (chapter-boundary shifts
   such as Num 13, Jonah 2, Job 39-40), single verses that clearly match a
   neighbour (with both neighbours), swapped adjacent verses (Matt 23:13-14),
   and pairs with an extreme length ratio (e.g. WEB Rom 14:23, which carries
   the doxology that RV1909 has at Rom 16:25-27; 1 John 5:7).
5. Splits by whole books (see DEV_BOOKS / TEST_BOOKS) and writes the file.
"""

from __future__ import annotations

import argparse
import collections
import html
import io
import lzma
import math
import os
import random
import re
import sys
import unicodedata

EN_MODULE = "engWEB2015eb"
ES_MODULE = "spaRV1909eb"

# Held-out books (OSIS ids).  See aiayn/corpora/README.md for the reasoning:
# no parallel passages (unlike Samuel/Kings/Chronicles or the synoptic
# gospels) and little quotation to or from other books.
DEV_BOOKS = ("Esth", "Eccl", "Lam", "Phil")
TEST_BOOKS = ("Acts", "Phlm")

# Books of RV1909 whose last verse carries a subscription after "Amén.".
SUBSCRIPTION_BOOKS = (
    "Rom", "1Cor", "2Cor", "Gal", "Eph", "Phil", "Col", "1Thess", "2Thess",
    "1Tim", "2Tim", "Titus", "Phlm", "Heb",
)

# Elements dropped together with their content.
DROP_ELEMENTS = ("note", "speaker")
# Tags that separate words (block/line level); all other tags are inline and
# are removed without leaving anything.
BLOCK_TAGS = {
    "div", "p", "l", "lg", "lb", "list", "item", "title", "chapter",
    "milestone", "verse", "head", "table", "row", "cell", "note", "speaker",
    "reference", "catchWord", "rdg", "figure",
}
SEP = "\x00"  # placeholder for a removed block tag or element
# No space is put after these or before these when a tag sat between them.
NO_SPACE_AFTER = set("“‘([{¿¡—–-/")
NO_SPACE_BEFORE = set(",.;:!?”’)]}—–-/…")

ENCLITIC = re.compile(r"(?:lo|la|los|las|le|les|me|te|se|nos|os)(?:lo|la|los|las|le|les|me|te|se|nos|os)?")
ACCENTED = re.compile(r"[áéíóú]")
NOT_VERBS = {"jehová", "josué", "éste", "ésta", "cuánto", "jesús", "moisés", "aquél", "él", "más", "aún"}
SHORT_IMPERATIVES = {"di", "da", "vi", "haz", "he", "ve", "ten", "pon", "sal", "ven"}
# Shift detector: per-verse cost and the evidence needed for a shifted run.
SHIFT_PENALTY = 0.05
SHIFT_MIN_EVIDENCE = 1.0
SHIFT_OFFSETS = (1, -1, 2, -2, 3, -3, 4, -4, 5, -5)
LOCAL_MIN_ALT = 0.7
LOCAL_MIN_GAIN = 0.4
LOCAL_MIN_WORDS = 4
SWAP_MIN_GAIN = 0.4


# --------------------------------------------------------------------------
# Reading the modules
# --------------------------------------------------------------------------

def open_bible(modules, name):
    bible = modules.get_bible_from_module(name)
    # pysword decompresses the whole book block for every verse it returns;
    # memoise the (private) block reader when present, for speed only.
    fn = getattr(bible, "_decompressed_text", None)
    if fn is not None:
        cache = {}

        def cached(testament, buf_num, _fn=fn, _cache=cache):
            key = (testament, buf_num)
            if key not in _cache:
                _cache[key] = _fn(testament, buf_num)
            return _cache[key]

        bible._decompressed_text = cached
    return bible


def read_module(modules, name):
    """Return (book order list, {(book, ch, v): raw OSIS text})."""
    bible = open_bible(modules, name)
    structure = bible.get_structure().get_books()
    order, verses = [], {}
    for testament in ("ot", "nt"):
        for book in structure.get(testament, []):
            order.append(book.osis_name)
            for ch, nverses in enumerate(book.chapter_lengths, 1):
                for v in range(1, nverses + 1):
                    text = bible.get(books=[book.osis_name], chapters=[ch], verses=[v], clean=False)
                    verses[(book.osis_name, ch, v)] = text or ""
    return order, verses


# --------------------------------------------------------------------------
# Cleaning
# --------------------------------------------------------------------------

TAG_RE = re.compile(r"<(/?)([A-Za-z][\w:]*)([^>]*?)(/?)>")
END_OF_TEXT_RE = re.compile(
    r'<chapter\b[^>]*\beID=|<div\b[^>]*\btype="(?:book|glossary|introduction|colophon|appendix)"[^>]*\beID=|'
    r'<div\b[^>]*\beID="[^"]*"[^>]*\btype="(?:book|glossary|introduction|colophon|appendix)"'
)


def _drop_elements(text):
    for name in DROP_ELEMENTS:
        text = re.sub(r"<%s\b[^>]*/>" % name, SEP, text)
        text = re.sub(r"<%s\b[^>]*>.*?</%s>" % (name, name), SEP, text, flags=re.S)
    # Titles: keep canonical ones (psalm superscriptions, Ps 119 acrostic
    # letters) as text, ending with punctuation; drop the others.
    def title(m):
        attrs, body = m.group(1), m.group(2)
        if 'canonical="true"' not in attrs:
            return SEP
        body = re.sub(r"<[^>]+>", "", body).strip()
        if body and not re.search(r"[.!?:;,][”’\"')]*$", body):
            body += "."
        return SEP + body + SEP
    text = re.sub(r"<title\b([^>]*)>(.*?)</title>", title, text, flags=re.S)
    text = re.sub(r"<title\b[^>]*/>", SEP, text)
    return text


def _inline_join(prev_word, run, next_frag, stats):
    """Decide what a run of inline tags between two letters becomes."""
    names = re.findall(r"</?([A-Za-z]+)", run)
    if "transChange" not in names:
        return ""  # e.g. </w><w ...>: never glued in these modules, keep as is
    if "w" not in names:
        # tag inside one <w> element: part of the same written word
        stats["es_enclitic_joined"] += 1
        return ""
    opens_tc = re.search(r"<transChange\b[^>]*>$", run) is not None
    pw = prev_word.lower()
    if opens_tc and ENCLITIC.fullmatch(next_frag) and pw not in NOT_VERBS and (
        pw.endswith("ndo") or re.search(r"(?:[aeiáéí]r|[aei]d)$", pw)
        or ACCENTED.search(pw) or pw in SHORT_IMPERATIVES
    ):
        stats["es_enclitic_joined"] += 1
        return ""
    stats["tag_space_inserted"] += 1
    return " "


def clean_osis(raw, stats):
    text = raw
    m = END_OF_TEXT_RE.search(text)
    if m:
        rest = text[text.find(">", m.start()) + 1:]
        rest = re.sub(r"<(note|title)\b.*?</\1>", "", rest, flags=re.S)
        if re.search(r"[^\W\d_]", re.sub(r"<[^>]+>", "", rest)):
            stats["trailing_non_verse_text_cut"] += 1
        text = text[: m.start()]
    text = _drop_elements(text)

    # Runs of inline tags between two letters: decide join or space.
    def inline(m):
        run = m.group(2)
        names = set(re.findall(r"</?([A-Za-z]+)", run))
        if names & BLOCK_TAGS:
            return m.group(1) + SEP + m.group(3)
        prev_word = re.search(r"[^\W\d_]+$", text[: m.start(2)]).group(0)
        next_frag = re.match(r"[^<]*", text[m.end(2):]).group(0)  # up to the next tag
        return m.group(1) + _inline_join(prev_word, run, next_frag, stats) + m.group(3)

    text = re.sub(r"([^\W\d_])((?:<[^>]+>)+)(?=[^\W\d_])()", inline, text)

    # Remaining tags: block tags -> separator, inline tags -> nothing.
    def tag(m):
        return SEP if m.group(2) in BLOCK_TAGS else ""

    text = TAG_RE.sub(tag, text)
    if "<" in text or ">" in text:
        stats["stray_angle_bracket"] += 1
    text = html.unescape(text)
    text = text.replace("¶", " ").replace("\u00a0", " ").replace("\u200b", "")

    # Resolve separators: one space between two words, nothing next to
    # punctuation that hugs its neighbour, and never doubled spaces.
    def sep(m):
        before = text2[m.start() - 1] if m.start() > 0 else ""
        after = text2[m.end()] if m.end() < len(text2) else ""
        if not before or not after or before in NO_SPACE_AFTER or after in NO_SPACE_BEFORE:
            return ""  # e.g. 'coins</q> <note>..</note> <q>?' -> 'coins?'
        return " "

    text2 = text
    text = re.sub(r"[\s%s]*%s[\s%s]*" % (SEP, SEP, SEP), sep, text2)
    text = unicodedata.normalize("NFC", text)
    text = re.sub(r"\s+", " ", text).strip()
    # a space left by a </q> before a closer: WEB writes ’” and ’? elsewhere
    text = re.sub(r"(?<=[’”]) (?=[’”?!.,;:])", "", text)
    return text


def strip_subscription(book, text):
    """Remove the RV1909 subscription that follows the final 'Amén.'."""
    i = text.rfind("Amén.")
    if i < 0:
        return text, ""
    tail = text[i + len("Amén."):].strip()
    if not tail:
        return text, ""
    return text[: i + len("Amén.")], tail


def build_truecase(texts):
    """Most frequent non-all-caps spelling of each word (lowercased key)."""
    counts = collections.defaultdict(collections.Counter)
    for t in texts:
        for w in re.findall(r"[^\W\d_]+", t):
            if not (len(w) > 1 and w.isupper()):
                counts[w.lower()][w] += 1
    return {k: c.most_common(1)[0][0] for k, c in counts.items()}


def fix_dropcap(text, truecase, stats, log):
    """Undo the all-caps first word(s) of a chapter in RV1909 verse 1."""
    tokens = list(re.finditer(r"[^\W\d_]+", text))
    for i, tok in enumerate(tokens):
        w = tok.group(0)
        if not (w.isupper() and (len(w) > 1 or (i + 1 < len(tokens) and tokens[i + 1].group(0).isupper()
                                                and len(tokens[i + 1].group(0)) > 1))):
            continue
        if len(w) > 1 and w.lower() not in truecase:
            continue  # only ever written in capitals (e.g. ALEPH): leave it
        # the run of all-caps words separated only by spaces
        run = [tok]
        j = i + 1
        while j < len(tokens) and tokens[j].group(0).isupper() and \
                text[run[-1].end():tokens[j].start()] == " ":
            run.append(tokens[j])
            j += 1
        out = text
        for k, t in reversed(list(enumerate(run))):
            word = t.group(0)
            new = truecase.get(word.lower(), word.lower())
            before = text[: run[0].start()].rstrip()
            if k == 0 and (not before or before[-1] in ".:;!?¿¡(“‘"):
                new = word[0] + word[1:].lower()
            out = out[: t.start()] + new + out[t.end():]
        if out != text:
            stats["es_dropcap_fixed"] += 1
            log.append(("dropcap", text[:60], out[:60]))
        return out
    return text


# --------------------------------------------------------------------------
# Alignment checks
# --------------------------------------------------------------------------

WORD_RE = re.compile(r"[^\W\d_]+")


def words(text):
    return set(w.lower() for w in WORD_RE.findall(text))


def build_lexicon(pairs, min_count=3, top=3):
    """Dice-coefficient translation candidates for each word, both directions."""
    cnt_en, cnt_es, co = collections.Counter(), collections.Counter(), collections.Counter()
    bags = []
    for en, es in pairs:
        a, b = words(en), words(es)
        bags.append((a, b))
        cnt_en.update(a)
        cnt_es.update(b)
    for a, b in bags:
        a = [w for w in a if cnt_en[w] >= min_count]
        b = [w for w in b if cnt_es[w] >= min_count]
        for x in a:
            for y in b:
                co[(x, y)] += 1
    best_en, best_es = collections.defaultdict(list), collections.defaultdict(list)
    for (x, y), c in co.items():
        if c < min_count:
            continue
        d = 2.0 * c / (cnt_en[x] + cnt_es[y])
        best_en[x].append((d, y))
        best_es[y].append((d, x))
    lex_en = {x: {y for _, y in sorted(v, reverse=True)[:top]} for x, v in best_en.items()}
    lex_es = {y: {x for _, x in sorted(v, reverse=True)[:top]} for y, v in best_es.items()}
    return lex_en, lex_es


def match_score(a, b, lex_ab, lex_ba):
    """Symmetric share of words whose translation candidates occur opposite."""
    def frac(x, y, lex):
        known = [w for w in x if w in lex]
        if not known:
            return None
        return sum(1 for w in known if lex[w] & y) / len(known)
    f1, f2 = frac(a, b, lex_ab), frac(b, a, lex_ba)
    vals = [f for f in (f1, f2) if f is not None]
    return min(vals) if vals else 0.0


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def main(argv=None):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sword-path", default="/usr/share/sword")
    ap.add_argument("--out", default=os.path.join(repo, "aiayn", "corpora", "bible-en-es.tsv.xz"))
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)

    try:
        from pysword.modules import SwordModules
    except ImportError:
        sys.exit("pysword is required: python -m pip install pysword==0.2.8")

    modules = SwordModules(args.sword_path)
    found = modules.parse_modules()
    for name, pkg in ((EN_MODULE, "sword-text-web"), (ES_MODULE, "sword-text-sparv")):
        if name not in found:
            sys.exit(f"SWORD module {name} not found under {args.sword_path}: apt-get install {pkg}")
    for name in (EN_MODULE, ES_MODULE):
        conf = found[name]
        print(f"module {name}: version {conf.get('version', '?')}, "
              f"versification {conf.get('versification', '?')}, licence {conf.get('distributionlicense', '?')}")

    stats = collections.Counter()
    log = []
    en_order, en_raw = read_module(modules, EN_MODULE)
    es_order, es_raw = read_module(modules, ES_MODULE)
    books = [b for b in es_order if b in set(en_order)]  # canonical KJV order
    book_index = {b: i for i, b in enumerate(books)}
    for b in DEV_BOOKS + TEST_BOOKS:
        assert b in book_index, b

    # One-sided references (other books or other versification).
    en_keys, es_keys = set(en_raw), set(es_raw)
    only_en = en_keys - es_keys
    only_es = es_keys - en_keys
    stats["refs_only_en_other_books"] = sum(1 for k in only_en if k[0] not in book_index)
    stats["refs_only_en_same_books"] = sum(1 for k in only_en if k[0] in book_index)
    stats["refs_only_es"] = len(only_es)
    for k in sorted(only_en | only_es):
        if k[0] in book_index:
            log.append(("one-sided", k, "en" if k in en_keys else "es"))

    keys = sorted(en_keys & es_keys, key=lambda k: (book_index[k[0]], k[1], k[2]))
    en = {k: clean_osis(en_raw[k], stats) for k in keys}
    es = {k: clean_osis(es_raw[k], stats) for k in keys}

    # RV1909: subscriptions of the epistles (last non-empty verse of the book).
    last = {}
    for k in keys:
        if es[k]:
            last[k[0]] = k
    for b in SUBSCRIPTION_BOOKS:
        k = last[b]
        es[k], tail = strip_subscription(b, es[k])
        if tail:
            stats["es_subscriptions_removed"] += 1
            log.append(("subscription", k, tail))

    # RV1909: drop-cap capitals on the first word(s) of each chapter.
    truecase = build_truecase(es[k] for k in keys if k[2] != 1)
    for k in keys:
        if k[2] == 1 and es[k]:
            es[k] = fix_dropcap(es[k], truecase, stats, log)

    def ref(k):
        return f"{k[0]} {k[1]}:{k[2]}"

    # Empty verses and their neighbours.
    drop = {}
    for k in keys:
        e, s = bool(en[k]), bool(es[k])
        if not (e and s):
            drop[k] = "empty_both" if not (e or s) else ("empty_en" if not e else "empty_es")
    keyset = set(keys)
    for k, why in list(drop.items()):
        if why == "empty_both":
            continue
        for dv in (-1, 1):
            n = (k[0], k[1], k[2] + dv)
            if n in keyset and n not in drop:
                drop[n] = "merged_neighbour"

    # Lexical alignment check on the remaining verses.
    live = [k for k in keys if k not in drop]
    lex_en, lex_es = build_lexicon([(en[k], es[k]) for k in live])
    wen = {k: words(en[k]) for k in keys}
    wes = {k: words(es[k]) for k in keys}
    score = {}
    segments = []
    by_chapter = collections.defaultdict(list)
    for k in keys:
        by_chapter[k[:2]].append(k)
    for chap, ks in by_chapter.items():
        s0 = [match_score(wen[k], wes[k], lex_en, lex_es) if k not in drop else None for k in ks]
        for i, k in enumerate(ks):
            score[k] = round(s0[i], 3) if s0[i] is not None else None
        for d in SHIFT_OFFSETS:
            # gain of pairing en[i] with es[i+d] instead of es[i]; best run (Kadane)
            best, best_span, run, start = 0.0, None, 0.0, 0
            for i, k in enumerate(ks):
                j = i + d
                if s0[i] is None or not (0 <= j < len(ks)) or not es[ks[j]]:
                    g = 0.0
                else:
                    g = match_score(wen[k], wes[ks[j]], lex_en, lex_es) - s0[i]
                g -= SHIFT_PENALTY
                if run <= 0:
                    run, start = 0.0, i
                run += g
                if run > best:
                    best, best_span = run, (start, i)
            if best >= SHIFT_MIN_EVIDENCE:
                a, b = best_span
                a, b = max(0, a - abs(d)), min(len(ks) - 1, b + abs(d))  # boundary verses hold merged text
                segments.append((ks[a], ks[b], d, round(best, 2)))
                for k in ks[a:b + 1]:
                    drop.setdefault(k, "shifted")
    for a, b, d, ev in segments:
        log.append(("shifted-segment", ref(a), ref(b), "es offset %+d" % d, "evidence %.2f" % ev))
    # Single verses whose text clearly belongs with a neighbour (different
    # verse division, e.g. Judg 14:18-20).
    for k in live:
        if k in drop or score[k] is None:
            continue
        if min(sum(1 for w in wen[k] if w in lex_en), sum(1 for w in wes[k] if w in lex_es)) < LOCAL_MIN_WORDS:
            continue  # too few known words (lists of names) for a reliable comparison
        alt = 0.0
        for dv in (-1, 1):
            n = (k[0], k[1], k[2] + dv)
            if n not in keyset:
                continue
            for a in (match_score(wen[k], wes[n], lex_en, lex_es) if es[n] else 0.0,
                      match_score(wen[n], wes[k], lex_en, lex_es) if en[n] else 0.0):
                alt = max(alt, a)
        score[k] = (score[k], round(alt, 3))
        if alt >= LOCAL_MIN_ALT and alt >= score[k][0] + LOCAL_MIN_GAIN:
            # the verse division differs here: drop the verse and both neighbours
            drop[k] = "neighbour_match"
            for dv in (-1, 1):
                n = (k[0], k[1], k[2] + dv)
                if n in keyset:
                    drop.setdefault(n, "neighbour_match")
    # Adjacent verses whose contents are swapped (e.g. Matt 23:13-14, where
    # WEB follows the Majority Text order).
    for k in live:
        n = (k[0], k[1], k[2] + 1)
        if k in drop or n not in keyset or n in drop:
            continue
        same = match_score(wen[k], wes[k], lex_en, lex_es) + match_score(wen[n], wes[n], lex_en, lex_es)
        cross = match_score(wen[k], wes[n], lex_en, lex_es) + match_score(wen[n], wes[k], lex_en, lex_es)
        if cross >= same + SWAP_MIN_GAIN:
            drop[k] = drop[n] = "swapped"
    # Length ratio outliers (one side carries text the other lacks).
    ratios = [math.log(len(es[k]) / len(en[k])) for k in live if k not in drop]
    ratios.sort()
    mu = ratios[len(ratios) // 2]
    for k in live:
        if k in drop:
            continue
        r = math.log(len(es[k]) / len(en[k])) - mu
        if abs(r) > math.log(2.2) and max(len(es[k]), len(en[k])) > 40:
            drop[k] = "length_ratio"

    for k in keys:
        if k in drop:
            log.append(("drop", ref(k), drop[k], score.get(k), en[k][:90], es[k][:90]))

    # Split and write.
    def split_of(book):
        return "test" if book in TEST_BOOKS else "dev" if book in DEV_BOOKS else "train"

    rows = [(split_of(k[0]), ref(k), en[k], es[k]) for k in keys if k not in drop]
    for r in rows:
        assert "\t" not in r[2] + r[3] and "\n" not in r[2] + r[3]
    buf = io.StringIO()
    buf.write("split\tref\ten\tes\n")
    for r in rows:
        buf.write("\t".join(r) + "\n")
    data = buf.getvalue().encode("utf-8")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    partial = f"{args.out}.partial"  # renamed when whole: a stopped build leaves the corpus it replaces as it was
    with open(partial, "wb") as f:
        # format/check/preset fixed => byte-identical output for the same input
        f.write(lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9 | lzma.PRESET_EXTREME))
    os.replace(partial, args.out)

    # Summary.
    if args.verbose:
        for entry in log:
            print("  ", *entry)
    print()
    print(f"books in both modules: {len(books)}; aligned references considered: {len(keys)}")
    dropped = collections.Counter(drop.values())
    print("references present in one module only:",
          f"{stats['refs_only_en_other_books']} (English-only books: deuterocanon),",
          f"{stats['refs_only_en_same_books']} (English-only refs in shared books),",
          f"{stats['refs_only_es']} (Spanish-only refs)")
    for why in ("empty_both", "empty_en", "empty_es", "merged_neighbour", "shifted", "neighbour_match", "swapped", "length_ratio"):
        print(f"dropped {why}: {dropped.get(why, 0)}")
    print(f"dropped total (shared references): {len(drop)}")
    for key in sorted(stats):
        if not key.startswith("refs_only"):
            print(f"fix {key}: {stats[key]}")
    per = collections.Counter(r[0] for r in rows)
    per_book = collections.defaultdict(collections.Counter)
    for r in rows:
        per_book[r[0]][r[1].rsplit(" ", 1)[0]] += 1
    for sp in ("train", "dev", "test"):
        extra = "" if sp == "train" else " (" + ", ".join(f"{b} {n}" for b, n in per_book[sp].items()) + ")"
        print(f"{sp}: {per[sp]} verses{extra}")
    print(f"total: {len(rows)} verses; wrote {args.out} ({os.path.getsize(args.out)} bytes, "
          f"{len(data)} bytes uncompressed)")

    rng = random.Random(args.seed)
    for sp in ("train", "dev", "test"):
        pool = [r for r in rows if r[0] == sp]
        print(f"\n--- {args.samples} random {sp} pairs ---")
        for r in rng.sample(pool, min(args.samples, len(pool))):
            print(f"[{r[1]}]\n  en: {r[2]}\n  es: {r[3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
