"""Paragraphs translated sentence by sentence (aiayn.sentences): split, put back around the
paragraph's own spaces and line breaks, by the library and through `aiayn translate
--split-sentences`."""

import re
import subprocess
import sys

import pytest

from aiayn.config import ArgosOptions, ServeOptions, check_options
from aiayn.sentences import interleave, spans_from_strings, split_sentences
from aiayn.translate import Translator
from test_faults import make_model


def test_a_paragraph_splits_into_sentences_and_joins_back_byte_for_byte():
    text = "  In the beginning God created the heavens. The earth was empty!   Darkness was there.\n\nGod said: light.  "
    sentences, rest = split_sentences(text, "en")
    assert sentences == ["In the beginning God created the heavens.", "The earth was empty!", "Darkness was there.",
                         "God said: light."]
    assert interleave(sentences, rest) == text
    assert interleave(["X"] * 4, rest) == "  X X   X\n\nX  "  # the spaces and line breaks as they were
    assert split_sentences("Mr. Smith went to Washington.", "en")[0] == ["Mr. Smith went to Washington."]
    assert split_sentences("", "en") == ([], [""]) and split_sentences("no stop at the end", "en")[0] == ["no stop at the end"]
    # Nothing to translate without a letter: a number, a rule of dashes stay in the text around.
    sentences, rest = split_sentences("Chapter 12.\n3.14\n----\nThe end.", "en")
    assert sentences == ["Chapter 12.", "The end."] and interleave(["X", "Y"], rest) == "X\n3.14\n----\nY"


def test_spans_of_a_splitter_that_changes_the_text_keep_what_is_left():
    assert spans_from_strings("one. two. three", ["one.", "TWO."]) == [(0, 4), (5, 15)]
    # From the first sentence it changed on, all is one piece: were the search to go on past it,
    # "two." would stay untranslated between the spans (found by mutation)
    assert spans_from_strings("one. two. three.", ["one.", "TWO.", "three."]) == [(0, 4), (5, 16)]


def test_sentencex_is_handed_one_byte_spaces_only_and_the_offsets_stay_the_texts(monkeypatch):
    """sentencex 1.0.32's Rust code panics on a letter, a space of several UTF-8 bytes and a "."
    (the server test sends such a text): it is handed every space as " ", whatever its version
    does with the others, and the spans are still offsets into the text as given."""
    import sentencex

    handed = []
    monkeypatch.setattr(sentencex, "segment", lambda lang, text: handed.append(text) or re.split(r"(?<=\.) ", text))
    text = "C\u00a0. the\u2009cat.\u3000A dog."
    assert split_sentences(text, "en", lines=False) == (["C\u00a0.", "the\u2009cat.", "A dog."],
                                                               ["", " ", "\u3000", ""])
    assert handed == ["C . the cat. A dog."]


def test_translate_split_sentences_puts_each_paragraph_on_one_line(tmp_path):
    model = make_model(tmp_path / "model")
    paragraphs = ["the small cat. a red bird eats the fish!", "", "  the river\t"]  # a line's own spaces stay (were stripped)
    (tmp_path / "in.txt").write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "aiayn", "translate", str(model), "--input", str(tmp_path / "in.txt"),
                           "--split-sentences", "--lang", "en", "--beam", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    translator = Translator.load(model, "cpu")
    expected = []
    for paragraph in paragraphs:
        sentences, rest = split_sentences(paragraph, "en")
        out = interleave(translator.translate(sentences, beam=2), rest) if sentences else ""
        expected.append(" ".join(out.splitlines()))
    assert done.stdout.split("\n")[:-1] == expected and expected[2].startswith("  ") and expected[2].endswith("\t")
    named = subprocess.run([sys.executable, "-m", "aiayn", "translate", str(model), "--input", str(tmp_path / "in.txt"),
                            "--split-sentences", "--lang", "english"], capture_output=True, text=True, timeout=300)
    assert named.returncode == 2 and named.stderr == "aiayn: error: --lang takes a language code (en, de, pt-BR), got 'english'\n"


def test_a_language_option_takes_a_code():
    for code in ("en", "yue", "pt-BR", "zh-Hans", "sr_Latn"):
        check_options(ServeOptions(run_dir="run", source_lang=code))
    for name in ("english", "e", "en-", "en us", "", "12"):
        with pytest.raises(ValueError, match=f"--target-lang takes a language code .*, got {name!r}"):
            check_options(ArgosOptions(source="run", out="x.argosmodel", target_lang=name))
