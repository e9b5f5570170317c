"""Resident memory of a server holding one model: `aiayn serve` in fp32, bf16 and int8, beside
CTranslate2 holding the same model (`aiayn export-hf`, then CTranslate2's converter) in float32,
bfloat16 (where this CPU has it for CTranslate2) and int8.

Each is a fresh process that has answered one translation: `aiayn serve MODEL --precision P`
(one POST /translate), and a CTranslate2 Translator loaded in a child process that translates the
same sentence. A pre-norm model (the demo's), which Marian cannot hold, is replaced by a post-norm
model of the same shape with random weights, for both. Their VmRSS and VmHWM come from /proc; the repetitions are interleaved and their
median is reported. The weights alone (bytes of the model's tensors in that precision) are given
beside, so that what the runtimes add (Python, torch or CTranslate2, FastAPI) is seen apart.

    .venv/bin/python benchmarks/serve_rss.py runs/demo60/averaged --reps 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import torch

from aiayn.device import cpu_kind
from aiayn.model import Transformer
from aiayn.run import resolve_model_dir
from aiayn.serve.process import ServerProcess
from aiayn.tokenizer import copy_tokenizer
from common import command_line, default_threads, machine, or_exit, parse_args, positive_int, write_results

HERE = Path(__file__).resolve().parent
SENTENCE = "In the beginning God created the heavens and the earth."
AIAYN = ("fp32", "bf16", "int8")
CT2 = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}

CT2_CHILD = """
import sys, ctranslate2, sentencepiece as spm
model, spm_path, compute_type, threads, text = sys.argv[1:6]
translator = ctranslate2.Translator(model, device="cpu", compute_type=compute_type, intra_threads=int(threads))
pieces = spm.SentencePieceProcessor(model_file=spm_path).encode(text, out_type=str) + ["</s>"]
result = translator.translate_batch([pieces], beam_size=4)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024, " ".join(result[0].hypotheses[0]))
"""


def memory_of(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, in MiB."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def aiayn_once(model_dir: str, precision: str) -> tuple[float, float]:
    with ServerProcess(model_dir, "--precision", precision) as server:
        body = json.dumps({"text": SENTENCE}).encode()
        request = urllib.request.Request(server.url + "translate", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as answer:
            answer.read()
        return memory_of(server.pid)


def ct2_once(ct2_dir: Path, spm_path: Path, compute_type: str, threads: int) -> tuple[float, float]:
    done = subprocess.run([sys.executable, "-c", CT2_CHILD, str(ct2_dir), str(spm_path), compute_type, str(threads),
                           SENTENCE], capture_output=True, text=True, check=True)
    rss, hwm, _ = done.stdout.split(" ", 2)
    return float(rss), float(hwm)


def weights_mib(model: Transformer, precision: str) -> float:
    """Parameters × bytes a weight at `precision`: a reference point for what the runtime adds
    (aiayn's int8 copy keeps its embeddings in fp32, so its weights are more than this)."""
    per = {"fp32": 4, "bf16": 2, "int8": 1}[precision]
    return sum(p.numel() for p in model.parameters()) * per / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a model or run folder")
    parser.add_argument("--reps", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--out", type=Path, help="default results/serve-rss-KIND.json")
    args = parse_args(parser, inputs=lambda args: [args.model])
    model_dir = or_exit(lambda: resolve_model_dir(args.model))
    try:
        import ctranslate2
    except ImportError:  # (found in a misuse hunt: a traceback)
        sys.exit("serve_rss: needs ctranslate2 and transformers (pip install 'aiayn[marian]', or benchmarks/.venv)")
    model = Transformer.load(model_dir)
    with tempfile.TemporaryDirectory(prefix="serve-rss-") as scratch:  # (found in a misuse hunt: left in /tmp, 100 MB a run)
        measure(args, model_dir, model, Path(scratch), ctranslate2)


def measure(args: argparse.Namespace, model_dir: Path, model: Transformer, work: Path, ctranslate2) -> None:
    """Everything after the arguments, with `work` a scratch folder removed after."""
    given = model_dir
    twin = model.config.norm_first  # Marian (and so CTranslate2's converter) has no pre-norm model
    if twin:
        torch.manual_seed(0)
        model = Transformer(dataclasses.replace(model.config, norm_first=False))
        model.save(work / "model")
        copy_tokenizer(model_dir, work / "model")
        model_dir = work / "model"
    subprocess.run([sys.executable, "-m", "aiayn", "export-hf", str(model_dir), str(work / "hf")], check=True,
                   capture_output=True)
    converter = ctranslate2.converters.TransformersConverter(str(work / "hf"))
    try:
        supported = ctranslate2.get_supported_compute_types("cpu")  # no bfloat16 on CPUs without AMX
        ct2_dirs = {p: Path(converter.convert(str(work / f"ct2-{p}"), quantization=CT2[p], force=True))
                    for p in CT2 if CT2[p] in supported}
        ct2_error = None
    except ValueError as error:  # see the note written with the results
        ct2_dirs, ct2_error = {}, " ".join(str(error).split())
        print(f"CTranslate2 cannot convert the exported model: {ct2_error}", flush=True)
    runs: dict[str, list[tuple[float, float]]] = {}
    for rep in range(args.reps):
        for precision in AIAYN:
            runs.setdefault(f"aiayn {precision}", []).append(aiayn_once(str(model_dir), precision))
            if precision in ct2_dirs:
                runs.setdefault(f"ctranslate2 {CT2[precision]}", []).append(
                    ct2_once(ct2_dirs[precision], work / "hf" / "source.spm", CT2[precision], args.threads))
            print(f"rep {rep + 1} {precision}: " + ", ".join(f"{name} {values[-1]}" for name, values in runs.items()
                                                             if precision in name or CT2[precision] in name)
                  + " MiB (RSS, peak)", flush=True)
    rows = {}
    for name, values in runs.items():
        precision = name.split()[1].replace("float32", "fp32").replace("bfloat16", "bf16")
        rows[name] = {"rss_mib": round(statistics.median(v[0] for v in values), 1),
                      "peak_mib": round(statistics.median(v[1] for v in values), 1),
                      "rss_range_mib": [round(min(v[0] for v in values), 1), round(max(v[0] for v in values), 1)],
                      "weights_mib": round(weights_mib(model, precision), 1)}
        print(f"{name}: RSS {rows[name]['rss_mib']} MiB, peak {rows[name]['peak_mib']} MiB "
              f"(weights {rows[name]['weights_mib']} MiB)")
    write_results(args.out or HERE / "results" / f"serve-rss-{cpu_kind()}.json", {
        "benchmark": "serve-rss", "command": command_line(), "cpu_kind": cpu_kind(),
        "machine": machine(torch.device("cpu"), args.threads), "model": str(given),
        "parameters": model.num_parameters(), "ctranslate2": ctranslate2.__version__, "reps": args.reps,
        "post_norm_twin": twin and "the model is pre-norm, which Marian cannot hold: both systems load a post-norm "
                                   "model of the same shape with random weights (memory does not depend on them)",
        "ctranslate2_error": ct2_error, "rows": rows})


if __name__ == "__main__":
    main()
