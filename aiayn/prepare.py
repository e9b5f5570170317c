"""What a run trains on and with: the configs of a new, fine-tuning or resumed run (`run_configs`);
the data, `--data DATA_DIR` as it is, or `--corpus` preprocessed once into RUN_DIR/data
(aiayn.store), so that both train from memory-mapped ids the same way; and the run's tokenizer,
which must be the data's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch.distributed as dist

from aiayn.batching import EncodedPairs, as_encoded, within_length
from aiayn.checkpoint import read_config
from aiayn.config import ModelConfig, TrainConfig, check_model_config, check_resumed
from aiayn.corpora import corpus_names, stream_corpus
from aiayn.device import check_precision, init_distributed, resolve_device
from aiayn.evaluate import bleu_metric
from aiayn.run import SPECIAL_IDS, RunDir, resolve_model_dir, said_model_dir
from aiayn.store import MANIFEST, Store, load_store, preprocess, text_digest, tokenizer_digest
from aiayn.tokenizer import EOS_ID, PAD_ID, TOKENIZER_FILES, UNK_ID, Tokenizer, copy_tokenizer, has_tokenizer, load_tokenizer


@dataclass
class TrainData:
    """Encoded sentence pairs (ids without BOS/EOS; lists of pairs or `EncodedPairs`), and the
    dev text for BLEU."""

    train: Union[EncodedPairs, Sequence]
    dev: Union[EncodedPairs, Sequence] = ()
    dev_text: Sequence[tuple[str, str]] = ()  # (source, reference) strings of the dev pairs
    tgt_lang: Optional[str] = None  # the references' language: dev BLEU tokenizes as sacreBLEU does for it

    def __post_init__(self) -> None:
        self.train, self.dev = as_encoded(self.train), as_encoded(self.dev)


def prepare_data(
    model_config: ModelConfig, recipe: TrainConfig, run: RunDir, echo: Callable[[str], None] = print,
) -> tuple[object, TrainData, Store]:
    """The run's data, memory-mapped: `--data DATA_DIR` as it is, else the corpus spec
    preprocessed into RUN_DIR/data first (by rank 0; the other ranks wait), so `--corpus` runs
    train exactly as `--data` runs do. The run folder gets the data's tokenizer.

    Returns (tokenizer, TrainData, Store). Pairs longer than `max_sentence_tokens` (either side,
    with BOS/EOS) are left out and counted, never silently dropped.
    """
    rank, world = init_distributed(recipe.device)
    data_dir = Path(recipe.data) if recipe.data else run.data
    failure = None
    if rank == 0:
        try:  # a rank-0 error must reach the others, or they wait at the barrier forever
            if not recipe.data:
                _preprocess_for_run(model_config, recipe, run, echo)
            store = load_store(data_dir)
            if not has_tokenizer(run.path):  # a new run is refused before it gets one (found in review: the
                _check_data_settings(store, model_config, recipe)  # tokenizer left made it look like a run)
            _give_run_the_tokenizer(store, recipe, run, echo)
        except (ValueError, OSError, ImportError) as error:
            failure = error
    if world > 1:
        flag = [failure is not None]
        dist.broadcast_object_list(flag, src=0)
        if flag[0] and failure is None:
            raise SystemExit(1)  # rank 0 reports the error
    if failure is not None:
        raise failure
    store = load_store(data_dir)
    _check_data_settings(store, model_config, recipe)
    # Said, not silent (found in review): the run records the larger limit it was given.
    if recipe.max_sentence_tokens > (made := store.manifest.get("max_sentence_tokens") or recipe.max_sentence_tokens):
        echo(f"note: {store.folder} was made with --max-sentence-tokens {made}: the longer pairs are not in it, so "
             f"{recipe.max_sentence_tokens} keeps no more of them")
    tokenizer = load_tokenizer(run.path)
    kept, dev_text = {}, []
    for name in ("train", "dev"):
        pairs = store.split(name) if name in store.splits else EncodedPairs.from_lists([])  # a corpus without dev
        rows = within_length(pairs.lengths, recipe.max_sentence_tokens)  # (kept,)
        if len(rows) < len(pairs):
            echo(f"{name}: left out {len(pairs) - len(rows):,} of {len(pairs):,} pairs longer than "
                 f"max_sentence_tokens={recipe.max_sentence_tokens}")
            pairs = pairs.subset(rows)
        kept[name] = pairs
        over = int((pairs.lengths.max(axis=1, initial=0) + 1 > recipe.max_tokens).sum()) if name == "train" else 0  # +1: BOS or EOS
        if over * 2 > len(pairs):  # (found in review: --max-tokens 1 trained without a word)
            echo(f"note: {over:,} of the {len(pairs):,} training pairs are longer than --max-tokens {recipe.max_tokens}: "
                 "each is a batch of its own, over that budget")
        if name == "dev" and len(rows):
            texts = store.texts("dev")
            dev_text = [texts[i] for i in rows.tolist()]
    counts = ", ".join(f"{name} {info['pairs']:,} pairs" for name, info in store.manifest["splits"].items())
    echo(f"data {data_dir} ({store.manifest['corpus']}, {store.src_lang}→{store.tgt_lang}): {counts}")
    if dev_text and recipe.eval_bleu_sentences:  # MeCab missing (ja, ko) is said now, not at the first validation
        bleu_metric(store.tgt_lang)
    return tokenizer, TrainData(kept["train"], kept["dev"], dev_text, store.tgt_lang), store


def _preprocess_for_run(model_config: ModelConfig, recipe: TrainConfig, run: RunDir,
                        echo: Callable[[str], None]) -> None:
    """RUN_DIR/data for a run from a corpus spec: kept when the run has checkpoints (they were
    trained on it) or when it was made from this very corpus and settings (a start that failed
    later); otherwise made anew."""
    data_dir = run.data
    try:
        manifest = load_store(data_dir).manifest
    except (ValueError, OSError):
        manifest = None
        if data_dir.is_dir() and any(data_dir.iterdir()) and not (data_dir / MANIFEST).exists():  # found in review
            raise ValueError(f"{data_dir} holds files aiayn did not make (no {MANIFEST}), which preprocessing the "
                             "corpus there would replace; choose another --out")
    trained = bool(run.checkpoints())
    if manifest is not None and trained:
        if (manifest["corpus"], manifest["vocab_size"]) != (recipe.corpus, model_config.vocab_size):
            echo(f"warning: this run was trained on {manifest['corpus']} ({data_dir}); the resumed run keeps it")
        return
    init_from = resolve_model_dir(recipe.init_from) if recipe.init_from else None
    # A run trained before RUN_DIR/data existed keeps its tokenizer: its checkpoints use its ids.
    tokenizer_from = init_from or (_trained_tokenizer(run) if trained else None)
    corpus = stream_corpus(recipe.corpus, recipe.src_lang, recipe.tgt_lang)
    echo(f"corpus {corpus.name} ({corpus.src_lang}→{corpus.tgt_lang}), preprocessed into {data_dir}")
    if manifest is not None:
        wanted = {"corpus": recipe.corpus, "vocab_size": model_config.vocab_size,
                  "max_sentence_tokens": recipe.max_sentence_tokens,
                  "tokenizer_from": str(tokenizer_from) if tokenizer_from else None,
                  "src_lang": corpus.src_lang, "tgt_lang": corpus.tgt_lang}
        # Every split's text, not only train's (found in review: an edited dev kept the old dev BLEU and test)
        if all(manifest.get(key) == value for key, value in wanted.items()) and set(manifest["splits"]) == set(corpus.splits) \
                and all(info.get("text_sha256") == text_digest(corpus, name) for name, info in manifest["splits"].items()):
            return
        echo(f"note: {data_dir} was made from other data or settings; making it again")
    preprocess(corpus, data_dir, model_config.vocab_size, spec=recipe.corpus, tokenizer_from=tokenizer_from,
               max_sentence_tokens=recipe.max_sentence_tokens, force=True, echo=echo)


def _trained_tokenizer(run: RunDir) -> Optional[Path]:
    """The folder of the tokenizer a run was trained with: RUN_DIR's, else its newest checkpoint's,
    which holds the one it was trained with (found in review: with RUN_DIR's removed, a resume
    trained a new tokenizer, or took another data folder's, without a word); None for neither."""
    return next((folder for folder in (run.path, *run.checkpoints()[-1:]) if has_tokenizer(folder)), None)


def _check_trained_tokenizer(store: Store, run: RunDir) -> None:
    """A trained run goes on with data of the tokenizer it was trained with: else the ids mean other words."""
    trained_with = _trained_tokenizer(run) if run.checkpoints() else None
    if trained_with is not None and tokenizer_digest(trained_with) != store.manifest["tokenizer_sha256"]:
        raise ValueError(f"{store.folder} was encoded with another tokenizer than the one this run was trained "
                         f"with ({trained_with}); resume with the data it was trained on")


def _give_run_the_tokenizer(store: Store, recipe: TrainConfig, run: RunDir, echo: Callable[[str], None]) -> None:
    """Copy the data's tokenizer into the run folder (it goes with every model saved), unless
    the run has one already, or its checkpoints do: then it must be the same, or the ids would
    mean other words."""
    run_dir = run.path
    started_from = recipe.init_from and not run.checkpoints()  # a trained run needs it no more: it may have moved
    if started_from and tokenizer_digest(resolve_model_dir(recipe.init_from)) != store.manifest["tokenizer_sha256"]:
        raise ValueError(f"{store.folder} was not encoded with the tokenizer of {recipe.init_from}; "
                         f"make it with: aiayn preprocess --tokenizer {recipe.init_from} ...")
    _check_trained_tokenizer(store, run)
    if has_tokenizer(run_dir) and tokenizer_digest(run_dir) != store.manifest["tokenizer_sha256"]:
        echo(f"note: replacing the tokenizer in {run_dir}, left by an earlier start, with the one of {store.folder}")
        for name in TOKENIZER_FILES:
            (run_dir / name).unlink(missing_ok=True)
    if not has_tokenizer(run_dir):
        copy_tokenizer(store.folder, run_dir)


def _check_data_settings(store: Store, model_config: ModelConfig, recipe: TrainConfig) -> None:
    # Said before the run folder gets a tokenizer (found by a misuse hunt: "no training pairs left
    # (all empty or longer than max_sentence_tokens?)", after it)
    if not len(within_length(store.split("train").lengths, recipe.max_sentence_tokens)):
        raise ValueError(f"no training pair of {store.folder} is left: each is longer than --max-sentence-tokens "
                         f"{recipe.max_sentence_tokens} (with BOS or EOS); raise --max-sentence-tokens")
    if store.manifest["vocab_size"] != model_config.vocab_size:
        # A fine-tuned model keeps its vocabulary, so only data of its tokenizer will do (found in review).
        fix = f"make it with: aiayn preprocess --tokenizer {recipe.init_from} ..." if recipe.init_from else \
            f"pass --vocab-size {store.manifest['vocab_size']}"
        raise ValueError(f"the tokenizer of {store.folder} has {store.manifest['vocab_size']} tokens but the model's "
                         f"vocab_size is {model_config.vocab_size}; {fix}")
    for given, kept, side in ((recipe.src_lang, store.src_lang, "source"), (recipe.tgt_lang, store.tgt_lang, "target")):
        if recipe.data and given is not None and given != kept:
            raise ValueError(f"{store.folder} has {kept} as its {side} language, not {given}")
    tokenizer = load_tokenizer(store.folder)
    names = SPECIAL_IDS
    if isinstance(tokenizer, Tokenizer):  # a SentencePiece model of its own BOS (Marian's decoder starts from pad)
        # (found by a misuse hunt: a model with bos_id -1, or 4, trained with BOS 1, one of its word pieces)
        if absent := [name for name in ("pad_id", "bos_id", "eos_id") if getattr(tokenizer, name) < 0]:
            raise ValueError(f"the tokenizer of {store.folder} has no {' and no '.join(n[:-3] for n in absent)} piece "
                             f"({', '.join(f'{n} -1' for n in absent)}), which training needs; train one with pad_id=0, "
                             "bos_id=1, eos_id=2, unk_id=3, or let aiayn preprocess train it (leave out --tokenizer)")
        names = (*SPECIAL_IDS, "bos_id")
    if wrong := [name for name in names if getattr(tokenizer, name) != getattr(model_config, name)]:
        # (noticed in review: data of a Marian tokenizer was refused without the flags that take it)
        ids = lambda of: ", ".join(f"{name} {getattr(of, name)}" for name in wrong)  # noqa: E731
        flags = " ".join(f"--{name.replace('_', '-')} {getattr(tokenizer, name)}" for name in wrong)
        raise ValueError(f"the tokenizer of {store.folder} has {ids(tokenizer)} but the model {ids(model_config)}, and "
                         f"a model takes its special ids from its tokenizer; pass {flags}")


def check_settings(model_config: ModelConfig, recipe: TrainConfig) -> None:
    """Mistakes that would otherwise surface only after the corpus is read and a tokenizer
    trained: a device that is not here, fp16 on a CPU, sentences longer than learned positions,
    special ids the tokenizer it will train cannot have."""
    check_model_config(model_config)
    if not isinstance(recipe, TrainConfig):  # (found in review: the two swapped were an AttributeError deep inside)
        raise TypeError(f"the training settings are a TrainConfig (TrainConfig(max_steps=...)), not a "
                        f"{type(recipe).__name__}")
    check_precision(resolve_device(recipe.device), recipe.precision, recipe.tf32)
    trained = dict(zip(SPECIAL_IDS, (PAD_ID, EOS_ID, UNK_ID)))  # a new run's tokenizer (Tokenizer.train)
    changed = [name for name in SPECIAL_IDS if getattr(model_config, name) != trained[name]]
    if changed and not (recipe.data or recipe.init_from):
        raise ValueError(f"--{changed[0].replace('_', '-')} {getattr(model_config, changed[0])}: the tokenizer a run "
                         "trains has pad 0, EOS 2 and unknown 3, and a model takes its special ids from its tokenizer")
    # A pair is kept where source + EOS and BOS + target fit in max_sentence_tokens (batching.within_length):
    # that many positions (found in review: one more was asked for).
    if model_config.positional == "learned" and recipe.max_sentence_tokens > model_config.max_len:
        raise ValueError(f"max_sentence_tokens={recipe.max_sentence_tokens} needs {recipe.max_sentence_tokens} "
                         f"learned positions (with BOS/EOS) but max_len is {model_config.max_len}; "
                         f"lower --max-sentence-tokens or raise --max-len")


def recorded_corpus(spec: str) -> str:
    """A corpus as a run or an experiment records it: a built-in name as it is, a file or folder
    by its resolved path (found by a misuse hunt: "pairs.tsv" recorded as typed was another file
    to a resume from another folder, and "DIR/" another corpus than "DIR" to an experiment)."""
    return spec if spec in corpus_names() or not Path(spec).exists() else str(Path(spec).resolve())


def run_configs(run: RunDir, resume: bool, preset_config: ModelConfig, recipe_model: dict, recipe_train: dict,
                model_overrides: dict, train_overrides: dict, given_preset: Optional[str] = None,
                given_recipe: Optional[str] = None, echo: Callable[[str], None] = print) -> tuple[ModelConfig, TrainConfig]:
    """The configs of a new run (a preset, the recipe's changes, then the options given), of a
    fine-tuning run (the model it starts from), or of the run being resumed (its own, with
    training options changed where given, each change said; `given_preset`, the --preset named:
    config.check_resumed). Paths to data and models are recorded absolute, for a resume from
    another folder."""
    for name in ("corpus", "data", "init_from", "src_lang", "tgt_lang"):  # "" would name the current folder
        if name in train_overrides and not str(train_overrides[name]).strip():  # (found in review; not a saved run's)
            raise ValueError(f"--{name.replace('_', '-')} is empty")
    train_overrides = {name: str(Path(value).absolute()) if name in ("data", "init_from") and value else
                       recorded_corpus(value) if name == "corpus" and value else value
                       for name, value in train_overrides.items()}
    store = None
    if "data" in train_overrides:
        if "corpus" in train_overrides:
            raise ValueError("give --corpus or --data, not both")
        store = load_store(train_overrides["data"])
        train_overrides["corpus"] = store.manifest["corpus"]  # recorded in train_config.json: what the run learnt from
    if resume and run.has_configs():
        if store is not None:  # refused before the notes of what the resume changes (found by a misuse hunt)
            _check_trained_tokenizer(store, run)
        return _resumed_configs(run, model_overrides, train_overrides, given_preset, given_recipe, echo)
    training = {**recipe_train, **train_overrides}
    if train_overrides.get("init_from"):  # fine-tuning: the model is the one being started from
        # Looked up once, with a note where a run folder gives a checkpoint, and recorded so: each
        # later lookup of a run still training could give a newer one (found in review).
        training["init_from"] = str(said_model_dir(training["init_from"], lambda text: echo(f"note: {text}")))
        _, model_config = read_config(training["init_from"])
        # A named preset and the recipe are held to the model too (found in review: ignored without
        # a word); the preset's vocabulary and special ids are the data's, not a shape.
        named = {f.name: getattr(preset_config, f.name) for f in dataclasses.fields(preset_config) if f.name not in
                 ("vocab_size", "pad_id", "bos_id", "eos_id", "unk_id")} if given_preset else {}
        asked = {name: (f"--preset {given_preset}", value) for name, value in named.items()}
        asked |= {name: ("the recipe", value) for name, value in recipe_model.items()}
        asked |= {name: (f"--{name.replace('_', '-')}", value) for name, value in model_overrides.items()}
        if changed := [(name, flag, value) for name, (flag, value) in asked.items()  # refused before any folder is made
                       if name not in ("dropout", "attention_dropout") and getattr(model_config, name) != value]:
            name, flag, value = changed[0]  # named, with both values (found in review: a recipe's norm_first unsaid)
            raise ValueError(f"{train_overrides['init_from']} holds another model shape than {flag} asks for ({name} "
                             f"{getattr(model_config, name)}, not {value}); fine-tuning keeps the model's shape, and "
                             "only dropout may change")
        return dataclasses.replace(model_config, **{name: value for name, (_, value) in asked.items()}), TrainConfig(**training)
    model_overrides = {**recipe_model, **model_overrides}
    fixed = [f"{name} {getattr(preset_config, name)}" for name in ("d_k", "d_v")
             if getattr(preset_config, name) is not None and name not in model_overrides]
    if fixed and {"d_model", "n_heads"} & model_overrides.keys():  # (found by an interop hunt: unsaid, a 215K-parameter "tiny" A1)
        echo(f"note: --preset {given_preset} fixes {' and '.join(fixed)} (Table 3 varies them), which stay as the "
             "model's width changes; give --d-k and --d-v to change them")
    if store is not None and "vocab_size" not in model_overrides:
        model_overrides["vocab_size"] = store.manifest["vocab_size"]  # a new model takes the data's vocabulary
        if store.manifest["vocab_size"] != preset_config.vocab_size:  # said (found by a newcomer's run of the README)
            echo(f"note: vocab_size {store.manifest['vocab_size']}, the tokenizer of {train_overrides['data']}, "
                 f"not the preset's {preset_config.vocab_size}")
    return dataclasses.replace(preset_config, **model_overrides), TrainConfig(**training)


def _resumed_configs(run: RunDir, model_overrides: dict, train_overrides: dict, given_preset: Optional[str],
                     given_recipe: Optional[str], echo: Callable[[str], None]) -> tuple[ModelConfig, TrainConfig]:
    """`run_configs` of the run being resumed: its own, with the training options given."""
    model_config, training = run.configs()
    notes = []  # said once the change is known to be allowed (found in review: said, then refused)
    if train_overrides.get("precision", "bf16") != "bf16" and "bf16_weights" not in train_overrides:
        train_overrides["bf16_weights"] = False  # a run moved off bf16 trains its fp32 weights
    if training.data and "corpus" in train_overrides and "data" not in train_overrides:
        raise ValueError(f"this run reads --data {training.data}; drop --corpus, or give another --data")
    # A data folder moved since is said so (found by a misuse hunt: "make one with: aiayn preprocess")
    if training.data and "data" not in train_overrides and not Path(training.data).is_dir():
        raise FileNotFoundError(f"no data folder {training.data}, which this run trains on; if it moved, resume with --data NEWPATH")
    if run.checkpoints():  # trained: it goes on from its own weights, on its own data (found in review)
        on_data = training.data or "data" in train_overrides  # the corpus is then the data's (found by a misuse hunt)
        kept = ["init_from"] + ([] if on_data else ["corpus", "src_lang", "tgt_lang"])
        for name in [name for name in kept if name in train_overrides]:
            if train_overrides.pop(name) != getattr(training, name):
                notes.append(f"note: --{name.replace('_', '-')} is not applied: {run.path} goes on from its "
                             f"checkpoints, with the {'data' if name != 'init_from' else 'weights'} it began with")
    if given_recipe:
        notes.append(f"note: --recipe sets up a new run; {run.path} goes on with its own settings "
                     "(train_config.json), which training flags change")
    moved = {name: value for name, value in train_overrides.items() if getattr(training, name) != value}
    if moved:  # another batching: the place in the epoch counts batches of the old one (found in review)
        changed = ", ".join(f"--{name.replace('_', '-')} {getattr(training, name)} → {value}" for name, value in moved.items())
        remade = {"max_tokens", "seed", "max_sentence_tokens"} & moved.keys()
        notes.append(f"note: {run.path} goes on with {changed}" + ("; the rest of this epoch is batched anew, so "
                     "some of its pairs may be seen twice and others not at all" if remade else ""))
    training = dataclasses.replace(training, **train_overrides)
    check_resumed(given_preset, model_config, model_overrides, training, train_overrides, run.model_config)
    for note in notes:
        echo(note)
    return model_config, training
