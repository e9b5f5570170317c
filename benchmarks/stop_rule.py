"""When beam search should stop (§6.1: "terminate early when possible"): fairseq's rule
(`--stop beams`, aiayn's default: a sentence ends once k hypotheses have ended) against
tensor2tensor's (`--stop bound`: once no live beam can outscore the best ended one), on the
built-in test books (bible-en-es): test BLEU and chrF of each, the verses whose output differs,
the model's own score of the outputs that differ (log P / lp, §6.1's α, from an fp32 pass), and
the decoding time, the two rules interleaved over the repetitions.

    .venv/bin/python benchmarks/stop_rule.py runs/demo/averaged          # beam 4, α 0.6, every test verse
    .venv/bin/python benchmarks/stop_rule.py runs/demo/averaged --sentences 200 --reps 1 --precision fp32

Writes results/stop-rule-KIND-PRECISION.json (KIND: the CPU kind). The model is any run or model
folder trained on bible-en-es, e.g. the averaged one `make demo` leaves in runs/demo/averaged
(a run folder stands for its last model).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from aiayn.config import DECODE_PRESETS
from aiayn.corpora import load_corpus
from aiayn.device import cpu_kind
from aiayn.evaluate import score_hypotheses
from aiayn.batching import collate
from aiayn.search import STOP_RULES, final_score
from aiayn.translate import Translator
from common import (RESULTS, command_line, default_threads, machine, or_exit, parse_args, positive_int,
                    require_precision, spread, write_results)


def model_scores(translator: Translator, sources: list[list[int]], outputs: list[list[int]], alpha: float) -> list[float]:
    """The model's log P(output, EOS | source) / lp(|output| + 1) of each output (§6.1's score),
    from one teacher-forced pass of `translator`'s model per batch of 64."""
    model, config, scores = translator.model, translator.model.config, []
    for start in range(0, len(sources), 64):
        batch = collate(list(zip(sources[start:start + 64], outputs[start:start + 64])), config.pad_id, config.bos_id,
                        config.eos_id)
        with torch.inference_mode():
            log_probs = model(batch.src, batch.tgt_in).float().log_softmax(-1)  # (N, T, V)
        picked = log_probs.gather(-1, batch.tgt_out.unsqueeze(-1)).squeeze(-1)  # (N, T)
        real = batch.tgt_out != config.pad_id
        scores += final_score((picked * real).sum(1), real.sum(1) - 1, alpha).tolist()
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run or model folder trained on bible-en-es")
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="bf16")
    parser.add_argument("--beam", type=positive_int, default=DECODE_PRESETS["translate"].beam)
    parser.add_argument("--sentences", type=positive_int, default=None, help="only the first N test verses")
    parser.add_argument("--reps", type=positive_int, default=3, help="timed repetitions of each rule, interleaved")
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--out", type=Path, default=None, help="result file (default results/stop-rule-KIND-PRECISION.json)")
    args = parse_args(parser, inputs=lambda args: [args.run_dir])
    torch.set_num_threads(args.threads)
    require_precision(args.precision)
    decode = dataclasses.replace(DECODE_PRESETS["translate"], beam=args.beam, precision=args.precision)
    translators = {stop: or_exit(lambda: Translator.load(args.run_dir, decode=dataclasses.replace(decode, stop=stop)))
                   for stop in STOP_RULES}
    measured_on = machine(torch.device("cpu"), args.threads)  # before the work, on an idle machine
    tokenizer = translators["beams"].tokenizer
    scorer = translators["beams"] if args.precision == "fp32" else Translator.load(args.run_dir)  # fp32
    test = load_corpus("bible-en-es").splits["test"][: args.sentences]
    sources = tokenizer.encode_batch([source for source, _ in test])
    outputs, seconds = {}, {stop: [] for stop in STOP_RULES}
    for rep in range(args.reps):
        for stop, translator in translators.items():
            start = time.perf_counter()
            outputs[stop] = translator.translate_ids(sources)
            seconds[stop].append(time.perf_counter() - start)
            print(f"rep {rep + 1}: {stop} {seconds[stop][-1]:.1f} s", flush=True)
    rows = []
    for stop in STOP_RULES:
        result = score_hypotheses([tokenizer.decode(ids) for ids in outputs[stop]], [t for _, t in test], 0.0)
        rows.append({"stop": stop, "bleu": result.bleu, "chrf": result.chrf, "seconds": spread(seconds[stop]),
                     "output_tokens": sum(map(len, outputs[stop]))})
        print(f"{stop}: BLEU {result.bleu:.2f}, chrF {result.chrf:.2f}, {statistics.median(seconds[stop]):.1f} s")
    differ = [i for i, (a, b) in enumerate(zip(outputs["beams"], outputs["bound"])) if a != b]
    beams, bound = (model_scores(scorer, [sources[i] for i in differ], [outputs[stop][i] for i in differ], decode.alpha)
                    if differ else [] for stop in STOP_RULES)
    higher = sum(b > a for a, b in zip(beams, bound))
    time_ratio = statistics.median(b / a for a, b in zip(seconds["beams"], seconds["bound"]))
    results = {
        "benchmark": "stop-rule", "command": command_line(), "machine": measured_on, "model": str(args.run_dir),
        "precision": args.precision, "beam": args.beam, "alpha": decode.alpha, "sentences": len(test),
        "bleu_signature": result.signature, "rows": rows, "verses_differing": len(differ),
        "bound_scored_higher": higher, "scores_where_they_differ": {"beams": beams, "bound": bound},
        "bound_over_beams_seconds": time_ratio,
    }
    print(f"{len(differ)} of {len(test)} verses differ; of those the bound rule's output scored higher on {higher}; "
          f"it took {time_ratio:.2f}× the time (median of {args.reps} interleaved ratios)")
    write_results(args.out or RESULTS / f"stop-rule-{cpu_kind()}-{args.precision}.json", results)


if __name__ == "__main__":
    main()
