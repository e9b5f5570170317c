"""English constituency parsing as sequence-to-sequence (§6.3).

§6.3 trains the Transformer to map a sentence to its parse tree, written as a sequence of tokens,
following Vinyals et al. (2015), "Grammar as a Foreign Language". This module holds the pieces
around the model:

* `read_trees`: Penn Treebank bracketed trees (WSJ .mrg files), with the standard preprocessing:
  empty elements (-NONE-) removed and function tags stripped.
* `linearize` / `delinearize`: tree <-> token sequence, `(S (NP XX XX )NP (VP XX )VP . )S` style.
  `delinearize` turns any model output into a tree, repairing malformed output by a fixed rule.
* `tree_to_string`: a tree in PTB bracket format, one line, as EVALB reads it.
* `evalb`: labelled bracket precision, recall and F1 with the conventions of EVALB's COLLINS.prm.
* `load_treebank_pairs`: (sentence, linearized tree) string pairs for `aiayn.corpora.ParallelCorpus`.
* Its decoding settings (§6.3: beam 21, α = 0.3, input length + 300) are `aiayn.config.DECODE_PRESETS["parse"]`.

`corpora/toy-treebank.mrg` beside this module is a toy treebank made for tests, NOT the Penn
Treebank: 80 short sentences generated from a small hand-written grammar with a fixed seed
(`tests/test_parsing.py` holds the generator and checks that it still writes the same file). Its
trees follow PTB conventions (outer unlabeled bracket, function tags, -NONE- traces, WSJ-style
indentation) so that the reader and the scorer are exercised on the real format. The WSJ part of
the Penn Treebank (LDC99T42) is licensed and not shipped.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence, Union

WORD_PLACEHOLDER = "XX"  # Vinyals et al. replace every word (and its POS tag) by one symbol
DEFAULT_ROOT = "S"  # the label delinearize gives a root it has to invent
EMPTY_TAG = "-NONE-"
# Wrappers around a whole tree that carry no constituent: WSJ's unlabeled "( (S ...) )", the TOP of
# many parsers' output, the ROOT of Stanford's.
_WRAPPERS = ("", "TOP", "ROOT")
# COLLINS.prm: DELETE_LABEL for these POS tags removes the word before spans are counted.
PUNCTUATION_TAGS = frozenset({",", ":", "``", "''", "."})
# COLLINS.prm: DELETE_LABEL TOP. The unlabeled outer bracket is read_trees' to remove; an inner
# unlabeled bracket is a bracket, as evalb.c counts it (its label "" is in no DELETE_LABEL).
UNCOUNTED_LABELS = frozenset({"TOP"})
# COLLINS.prm: EQ_LABEL ADVP PRT. One pair only, so mapping one onto the other is an equivalence.
EQUIVALENT_LABELS = {"PRT": "ADVP"}


@dataclass(frozen=True)
class Leaf:
    """A preterminal: a POS tag over one word."""

    tag: str
    word: str


@dataclass(frozen=True)
class Tree:
    """A constituent: a phrase label over a tuple of children (Tree or Leaf); only delinearize of
    an empty sentence gives one with no children."""

    label: str
    children: tuple[Union["Tree", Leaf], ...]

    def leaves(self) -> list[Leaf]:
        """The preterminals, left to right."""
        out: list[Leaf] = []
        stack: list[Union[Tree, Leaf]] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, Leaf):
                out.append(node)
            else:
                stack.extend(reversed(node.children))
        return out

    def words(self) -> list[str]:
        return [leaf.word for leaf in self.leaves()]


Node = Union[Tree, Leaf]


# --------------------------------------------------------------------------------------------
# Reading PTB trees


_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def read_trees(text: str) -> list[Tree]:
    """Every bracketed tree in `text`, in order, preprocessed as is standard for WSJ parsing.

    Trees may span lines and may sit in an outer unlabeled bracket, "( (S ...) )", as in WSJ .mrg
    files; an outer bracket labelled "", TOP or ROOT around a single tree is removed (one around
    several trees is kept, labelled TOP, which evalb does not count). `(TAG word)` is a `Leaf`.

    Preprocessing: leaves tagged -NONE- (traces and other empty elements) are removed, and so is
    every constituent left with no children by that; then function tags and indices are stripped
    from phrase labels at the first "-" or "=" (NP-SBJ-1 -> NP, PP-LOC=2 -> PP), as EVALB's
    modify_label does. POS tags are kept as written, so -NONE-, -LRB- and -RRB- stay intact (a
    label that starts with "-" is never cut). Unary chains that removal leaves (S -> VP) are kept.

    Raises ValueError, with line and column, for unbalanced brackets or a malformed bracket.
    """
    if not isinstance(text, str):  # (found by a misuse hunt: a Path was a TypeError of the regex)
        raise TypeError(f"read_trees takes the text of trees, not a {type(text).__name__}: read_trees(path.read_text())")
    trees = []
    for node, where in _parse(text):
        cleaned = _preprocess(node)
        if cleaned is None:
            raise ValueError(f"the tree at {where} holds only empty elements (-NONE-)")
        if isinstance(cleaned, Leaf):
            raise ValueError(f"the tree at {where} is a lone ({cleaned.tag} {cleaned.word}); a tree needs a phrase")
        trees.append(cleaned)
    return trees


def _position(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


# Treebank trees are a few dozen brackets deep (WSJ: under 40); the tree functions recurse once
# per level, so deeper input is refused before it meets Python's recursion limit.
MAX_DEPTH = 200


def _parse(text: str) -> Iterator[tuple[Node, str]]:
    # Each stack entry: [label, children, offset of its "("]. Labels are None until read.
    stack: list[list] = []
    for match in _TOKEN.finditer(text):
        token, offset = match.group(), match.start()
        if token == "(":
            if len(stack) == MAX_DEPTH:
                raise ValueError(f"the tree at {_position(text, stack[0][2])} is nested deeper than {MAX_DEPTH} brackets")
            stack.append([None, [], offset])
        elif token == ")":
            if not stack:
                raise ValueError(f"unbalanced brackets: ')' at {_position(text, offset)} closes nothing")
            label, children, start = stack.pop()
            node = _make_node(label or "", children, text, start, outer=not stack)
            if stack:
                stack[-1][1].append(node)
            else:
                yield node, _position(text, start)
        elif not stack:
            raise ValueError(f"text outside brackets: {token!r} at {_position(text, offset)}")
        elif stack[-1][0] is None and not stack[-1][1]:
            stack[-1][0] = token
        else:
            stack[-1][1].append(token)
    if stack:
        raise ValueError(f"unbalanced brackets: '(' at {_position(text, stack[-1][2])} is never closed")


def _make_node(label: str, children: list, text: str, start: int, outer: bool) -> Node:
    words = [child for child in children if isinstance(child, str)]
    where = _position(text, start)
    if not children:
        raise ValueError(f"empty bracket ({label}) at {where}")
    if words:
        if len(children) > 1:
            raise ValueError(f"bracket ({label} ...) at {where} holds a word beside other elements")
        return Leaf(label, words[0])
    if outer and label in _WRAPPERS:  # only around a whole tree (found in review: an inner ROOT went, and its error)
        return children[0] if len(children) == 1 and isinstance(children[0], Tree) else Tree("TOP", tuple(children))
    return Tree(label, tuple(children))


def strip_function_tags(label: str) -> str:
    """NP-SBJ-1 -> NP, PP-LOC=2 -> PP, WHNP-1 -> WHNP; -NONE-, -LRB-, -RRB- unchanged."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0]


def _preprocess(node: Node) -> Union[Node, None]:
    if isinstance(node, Leaf):
        return None if node.tag == EMPTY_TAG else node
    children = tuple(kept for kept in map(_preprocess, node.children) if kept is not None)
    return Tree(strip_function_tags(node.label), children) if children else None


# --------------------------------------------------------------------------------------------
# Linearization (Vinyals et al., 2015)


def linearize(tree: Tree) -> tuple[list[str], list[str]]:
    """(words, target): the sentence, and the tree as Vinyals et al. write it for seq2seq.

    Every constituent becomes "(LABEL", its children, ")LABEL"; every word with its POS tag becomes
    one "XX". POS tags are dropped, as Vinyals et al. did ("we replaced all POS tags with XX"); the
    words are in `words`, the source side. Example: (S (NP (DT the) (NN dog)) (VP (VBZ barks)) (. .))
    gives ["the", "dog", "barks", "."] and "(S (NP XX XX )NP (VP XX )VP XX )S".split().
    """
    if not isinstance(tree, Tree):  # (found by a misuse hunt: a string was an AttributeError)
        raise TypeError(f"linearize takes a Tree, as read_trees(text) gives them, not a {type(tree).__name__}")
    target: list[str] = []

    def walk(node: Node) -> None:
        if isinstance(node, Leaf):
            target.append(WORD_PLACEHOLDER)
            return
        target.append("(" + node.label)
        for child in node.children:
            walk(child)
        target.append(")" + node.label)

    walk(tree)
    return tree.words(), target


def parser_vocabulary(tokenizer) -> bool:
    """Whether XX, the word of a linearized tree (`linearize`), is a piece of the vocabulary, as
    in any parsing model's but the smallest: the most frequent word of its targets gets one from
    about 310 pieces up (the toy treebank's). A translation model's has none, and `aiayn parse`
    would repair its every output into a flat tree without a word."""
    pieces = [tokenizer.id_to_piece(i) for i in tokenizer.encode_target_batch([WORD_PLACEHOLDER])[0]]
    return any(piece.lstrip("▁") == WORD_PLACEHOLDER for piece in pieces)


def _check_words(words: Sequence[str]) -> None:
    """Words as `line.split()` gives them (found by a misuse hunt: a sentence given as a string was
    a word a character, a space among them, and the tree written no reader reads back)."""
    if isinstance(words, str):
        raise TypeError("words is a list of words, not a string: delinearize(output, line.split())")
    if not all(isinstance(word, str) and word and not any(c.isspace() for c in word) for word in words):
        raise ValueError("every word is a non-empty string without whitespace, as line.split() gives them")


def delinearize(target_tokens: Union[str, Sequence[str]], words: Sequence[str]) -> Tree:
    """The tree that `target_tokens` describes over `words` (as `line.split()` gives them), every
    leaf tagged XX. Never raises for what a model outputs.

    `target_tokens` is a token list or a string split on whitespace. A well-formed linearization
    comes back exactly: delinearize(*reversed(linearize(t))) is `t` with every POS tag "XX".
    Anything else is repaired, reading left to right with a stack of open constituents:

    1. "(L" opens a constituent labelled L, where L holds no bracket ("(S(NP" or "(NP)" is junk,
       rule 4: as a label it would write a tree no reader reads back), unless MAX_DEPTH - 2 are
       open: then it is junk too (found in review: a model looping on "(NP" wrote trees that
       `read_trees` refused, and deeper ones were a RecursionError).
    2. ")L" (or a bare ")") closes the innermost open constituent, whatever L is (a wrong label
       does not reach further out); a closing bracket with no constituent open is dropped.
    3. "XX" takes the next word, inside the innermost open constituent (at the top level if none
       is open); an XX with no word left is dropped.
    4. Any other token (a bare "(" or a POS tag, say) is dropped.
    5. At the end, words no XX took are appended, in order, inside the innermost open constituent;
       if none is open, inside the last item of the top level if that is a constituent; otherwise
       at the top level. Then the open constituents are closed, innermost first.
    6. A constituent with no children when it closes is dropped.
    7. If the top level is not exactly one constituent (several, a stray word, or nothing), it
       is wrapped in (S ...); with no words and no constituent that is the childless "(S )".

    So the result's words are always exactly `words`, in order, and its labels come from the
    opening brackets.
    """
    _check_words(words)
    tokens = target_tokens.split() if isinstance(target_tokens, str) else list(target_tokens)
    remaining = list(words)
    remaining.reverse()  # pop() gives the next word
    top: list[Node] = []
    stack: list[tuple[str, list[Node]]] = []

    def close() -> None:
        label, children = stack.pop()
        if children:
            (stack[-1][1] if stack else top).append(Tree(label, tuple(children)))

    for token in tokens:
        if token == WORD_PLACEHOLDER:
            if remaining:
                (stack[-1][1] if stack else top).append(Leaf(WORD_PLACEHOLDER, remaining.pop()))
        elif token.startswith("(") and len(token) > 1 and "(" not in token[1:] and ")" not in token[1:]:
            if len(stack) < MAX_DEPTH - 2:  # room for the leaves' brackets and an (S ...) around all
                stack.append((token[1:], []))
        elif token.startswith(")"):
            if stack:
                close()
        # anything else is junk: dropped
    missing = [Leaf(WORD_PLACEHOLDER, word) for word in reversed(remaining)]
    if missing:
        if stack:
            stack[-1][1].extend(missing)
        elif top and isinstance(top[-1], Tree):
            top[-1] = Tree(top[-1].label, top[-1].children + tuple(missing))
        else:
            top.extend(missing)
    while stack:
        close()
    if len(top) == 1 and isinstance(top[0], Tree):
        return top[0]
    return Tree(DEFAULT_ROOT, tuple(top))


def tree_to_string(tree: Node) -> str:
    """The tree in PTB bracket format on one line: (S (NP (DT the) (NN dog)) (VP (VBZ barks))).
    A bracket in a word is written as the treebank writes it, -LRB- and -RRB-, so that the line
    reads back as the same tree."""
    if isinstance(tree, Leaf):
        return f"({tree.tag} {tree.word.replace('(', '-LRB-').replace(')', '-RRB-')})"
    return f"({tree.label} {' '.join(tree_to_string(child) for child in tree.children)})"


# --------------------------------------------------------------------------------------------
# Scoring


def holds_trees(lines: Sequence[str]) -> bool:
    """Whether `lines` look like bracketed trees, not sentences: every non-blank one starts with
    "(" (a tree, or a line of one spread over several as in WSJ's .mrg files), one opens a bracket
    in a bracket, "(S (" or "( (", and one closes. "(Applause)" is a sentence."""
    shown = [line.strip() for line in lines if line.strip()]
    return (bool(shown) and all(line.startswith("(") for line in shown) and any(")" in line for line in shown)
            and any(re.match(r"\(\S*\s+\(", line) for line in shown))


def evalb(gold_trees: Sequence[Tree], test_trees: Sequence[Tree]) -> dict[str, float]:
    """Labelled bracket scores over a corpus, as EVALB with COLLINS.prm computes them.

    Returns precision, recall and f1 (percentages, like EVALB and the paper's Table 4),
    complete_match (percentage of sentences whose bracket multisets agree), and the counts
    matched, gold, test and sentences. Scores are micro-averaged: brackets are summed over all
    sentences before dividing, recall = matched / gold, precision = matched / test,
    f1 = 2 matched / (gold + test); a zero denominator gives 0.

    Our reading of COLLINS.prm (and of evalb.c, which applies it):
    * A bracket is (label, start, end) over word positions; every phrase node counts, each node
      of a unary chain separately; preterminals (POS tags) are not brackets. Brackets form a
      multiset: two identical brackets need two matching ones.
    * DELETE_LABEL TOP: nodes labelled TOP are not counted (the unlabeled outer bracket read_trees
      removes; an inner unlabeled one is counted, as evalb.c counts it). The S over the whole sentence is counted.
    * DELETE_LABEL , : `` '' .: those words are deleted before positions are numbered. evalb.c
      deletes them by each tree's own tags; a seq2seq parser's leaves are all XX, so here both
      trees delete the word positions that the GOLD tree tags as punctuation. A bracket that
      covers only deleted words spans nothing and is not counted (evalb.c's "zero element").
    * DELETE_LABEL -NONE-: read_trees removes empty elements already.
    * Labels are cut at the first "-" or "=" (evalb.c's modify_label); EQ_LABEL ADVP PRT makes
      ADVP and PRT match each other.
    * The two trees of a sentence must have the same words; evalb.c rejects the sentence
      ("Length unmatch", "Words unmatch"), here that is a ValueError.
    * Where we part from evalb.c: the outer ROOT or unlabeled bracket that read_trees removes is
      not counted, where evalb.c counts a ROOT that both files have; a sentence of punctuation
      alone counts, with no brackets and as a complete match, where evalb.c skips it.
    """
    for trees in (gold_trees, test_trees):  # (found by a misuse hunt: a Tree or strings were AttributeErrors)
        if isinstance(trees, (str, Tree)) or not all(isinstance(tree, Tree) for tree in trees):
            raise TypeError("evalb takes two lists of trees, as read_trees(text) gives them")
    if len(gold_trees) != len(test_trees):
        raise ValueError(f"{len(gold_trees)} gold trees but {len(test_trees)} test trees")
    matched = gold_total = test_total = complete = 0
    for number, (gold, test) in enumerate(zip(gold_trees, test_trees), start=1):
        gold_leaves, test_words = gold.leaves(), test.words()
        if [leaf.word for leaf in gold_leaves] != test_words:
            raise ValueError(
                f"sentence {number}: gold words {' '.join(leaf.word for leaf in gold_leaves)!r} "
                f"differ from test words {' '.join(test_words)!r}"
            )
        kept = [leaf.tag not in PUNCTUATION_TAGS for leaf in gold_leaves]
        gold_brackets, test_brackets = _brackets(gold, kept), _brackets(test, kept)
        common = sum((gold_brackets & test_brackets).values())
        gold_count, test_count = sum(gold_brackets.values()), sum(test_brackets.values())
        matched, gold_total, test_total = matched + common, gold_total + gold_count, test_total + test_count
        complete += gold_count == test_count == common
    sentences = len(gold_trees)
    return {
        "precision": 100.0 * matched / test_total if test_total else 0.0,
        "recall": 100.0 * matched / gold_total if gold_total else 0.0,
        "f1": 200.0 * matched / (gold_total + test_total) if matched else 0.0,
        "complete_match": 100.0 * complete / sentences if sentences else 0.0,
        "matched": matched,
        "gold": gold_total,
        "test": test_total,
        "sentences": sentences,
    }


def _brackets(tree: Tree, kept: list[bool]) -> Counter:
    # Position of each word among the kept ones: prefix[i] = kept words before word i.
    prefix = [0]
    for keep in kept:
        prefix.append(prefix[-1] + keep)
    brackets: Counter = Counter()

    def walk(node: Node, start: int) -> int:
        if isinstance(node, Leaf):
            return start + 1
        end = start
        for child in node.children:
            end = walk(child, end)
        label = strip_function_tags(node.label)
        if label not in UNCOUNTED_LABELS and prefix[end] > prefix[start]:
            brackets[EQUIVALENT_LABELS.get(label, label), prefix[start], prefix[end]] += 1
        return end

    walk(tree, 0)
    return brackets


# --------------------------------------------------------------------------------------------
# Corpus


def load_treebank_pairs(path: Union[str, Path]) -> list[tuple[str, str]]:
    """(source, target) pairs of a bracketed treebank file for `aiayn.corpora.ParallelCorpus`: the
    words joined by spaces, and the linearized tree (see `linearize`) joined by spaces."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such treebank file: {path}")
    try:
        trees = read_trees(path.read_text(encoding="utf-8-sig"))  # -sig: a BOM, as every other reader takes it
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    pairs = []
    for tree in trees:
        words, target = linearize(tree)
        pairs.append((" ".join(words), " ".join(target)))
    return pairs
