"""`aiayn serve` beside LibreTranslate 1.9.6 serving the same model, under the same client load.

Both servers answer LibreTranslate's API. LibreTranslate serves the run exported as an Argos
package (`aiayn export-argos`: the model written for CTranslate2, which LibreTranslate decodes
with), installed into a throw-away data folder. Its sentence splitter is spaCy's rule-based
sentencizer (`ARGOS_CHUNK_TYPE=SPACY`, a blank spaCy pipeline in the package's spacy/ folder):
LibreTranslate's default splitter, MiniSBD, and spaCy's and Stanza's statistical models are
downloaded on first use, and this machine reaches no network but the package registries.
CTranslate2 computes in the precision aiayn serves in (`ARGOS_COMPUTE_TYPE`: float32, int8 or
bfloat16), beam 4 for both; each keeps its own length penalty (LibreTranslate's 0.2, aiayn's
α 0.6 of §6.1).

Every client keeps one HTTP connection and sends one test verse of bible-en-es per request, as
benchmarks/serve_load.py does: 1 client, then 16, to each server in turn (aiayn's one client to a
server with --max-wait-ms 0), --reps times, each mode for --seconds. Reports sentences/s and
latency percentiles per mode (medians and range), aiayn's over LibreTranslate's, and each
server's resident memory. Writes results/libretranslate-load-CPUKIND-PRECISION.json.

    bash benchmarks/setup_libretranslate.sh       # benchmarks/.venv-libretranslate (LibreTranslate 1.9.6, spaCy)
    python benchmarks/libretranslate_load.py runs/demo --precision int8
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from aiayn.ct2 import export_argos
from aiayn.serve.process import ServerProcess, free_port
from common import (HERE, RESULTS, command_line, cpu_kind, default_threads, parse_args, positive_float, positive_int, require_precision,
                    spread, tree_rss_mib, write_results)
from serve_load import load, machine_info, matmul_peak, peak_precision, test_verses

VENV = HERE / ".venv-libretranslate"
COMPUTE_TYPES = {"fp32": "float32", "int8": "int8", "bf16": "bfloat16"}  # aiayn's precision -> CTranslate2's
# Run in LibreTranslate's environment: the package with a blank spaCy pipeline for argostranslate's
# spaCy splitter, installed where the environment variables point.
INSTALL = """
import sys, shutil, zipfile
from pathlib import Path
import spacy
import argostranslate.package
package, language, work = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
with zipfile.ZipFile(package) as archive:
    archive.extractall(work)
(folder,) = [path for path in work.iterdir() if path.is_dir()]
spacy.blank(language).to_disk(folder / "spacy")
with zipfile.ZipFile(work / package.name, "w") as archive:
    for path in sorted(folder.rglob("*")):
        archive.write(path, path.relative_to(work))
argostranslate.package.install_from_path(work / package.name)
print(argostranslate.package.get_installed_packages())
"""


@contextlib.contextmanager
def libretranslate(run_dir: str, source: str, target: str, precision: str, home: Path):
    """A LibreTranslate server of `run_dir` on a free port: yields (port, process)."""
    env = {**os.environ, "XDG_DATA_HOME": str(home / "data"), "XDG_CACHE_HOME": str(home / "cache"),
           "XDG_CONFIG_HOME": str(home / "config"), "ARGOS_CHUNK_TYPE": "SPACY",
           "ARGOS_COMPUTE_TYPE": COMPUTE_TYPES[precision],
           # The threads aiayn serve decodes on, all the machine gives (found in review: CTranslate2
           # was left to pick, which is the same on these machines but need not be elsewhere)
           "ARGOS_INTRA_THREADS": str(default_threads()), "ARGOS_INTER_THREADS": "1",
           "OMP_NUM_THREADS": str(default_threads())}
    package = home / f"{source}_{target}.argosmodel"
    export_argos(run_dir, package, source, target, echo=lambda _: None)
    subprocess.run([str(VENV / "bin" / "python"), "-c", INSTALL, str(package), source, str(home / "unzipped")],
                   env=env, check=True, capture_output=True, text=True)
    port = free_port()
    log = (home / "libretranslate.log").open("w")
    process = subprocess.Popen([str(VENV / "bin" / "libretranslate"), "--host", "127.0.0.1", "--port", str(port),
                                "--load-only", f"{source},{target}", "--disable-web-ui"],
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"LibreTranslate exited: {(home / 'libretranslate.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/languages", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("LibreTranslate did not answer within 300 s") from None
                time.sleep(0.5)
        yield port, process
    finally:
        process.terminate()
        process.wait(60)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", default="runs/demo", help="the model to serve (default runs/demo)")
    parser.add_argument("--precision", default="int8", choices=list(COMPUTE_TYPES))
    parser.add_argument("--clients", type=positive_int, default=16)
    parser.add_argument("--seconds", type=positive_float, default=30.0, help="per mode and repetition (default 30)")
    parser.add_argument("--reps", type=positive_int, default=3)
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="es")
    parser.add_argument("--out", type=Path)
    args = parse_args(parser, inputs=lambda args: [args.run_dir])
    if not Path(args.run_dir).exists():
        parser.exit(2, f"error: {args.run_dir} does not exist (make demo trains runs/demo)\n")
    if not (VENV / "bin" / "libretranslate").exists():
        parser.exit(2, "error: no LibreTranslate: run bash benchmarks/setup_libretranslate.sh\n")
    require_precision(args.precision)
    verses, pair = test_verses(), (args.source_lang, args.target_lang)
    results = {"command": command_line(), "cpu_kind": cpu_kind(), "machine": machine_info(), "model": args.run_dir,
               "precision": args.precision, "libretranslate_compute_type": COMPUTE_TYPES[args.precision],
               "requests": "LibreTranslate's API, one test verse of bible-en-es each, beam 4",
               f"{peak_precision(args.precision)}_matmul_peak_tflops": matmul_peak(args.precision)}
    home = Path(tempfile.mkdtemp(prefix="libretranslate-load."))
    try:
        with contextlib.ExitStack() as stack:
            lt_port, lt = stack.enter_context(libretranslate(args.run_dir, *pair, args.precision, home))
            ours = stack.enter_context(ServerProcess(args.run_dir, "--precision", args.precision))
            ours_alone = stack.enter_context(ServerProcess(args.run_dir, "--precision", args.precision,
                                                           "--max-wait-ms", "0"))
            ports = {"libretranslate": (lt_port, lt_port), "aiayn": (ours_alone.port, ours.port)}
            for one, many in ports.values():  # warm-up
                load(one, 1, 3, verses, 0, pair)
                load(many, 2, 3, verses, 0, pair)
            reps = []
            for rep in range(args.reps):
                start, runs = rep * 97, {}
                for system, (one, many) in ports.items():
                    runs[f"{system}_one"] = load(one, 1, args.seconds, verses, start, pair)
                    runs[f"{system}_many"] = load(many, args.clients, args.seconds, verses, start, pair)
                reps.append(runs)
                print(f"rep {rep + 1}: " + ", ".join(f"{mode} {run['sentences_per_s']:.1f}/s p50 "
                                                     f"{run['latency_ms']['p50']:.0f} ms ({run['errors']} errors)"
                                                     for mode, run in runs.items()), flush=True)
            results["reps"] = reps
            results["summary"] = {mode: {"sentences_per_s": spread([r[mode]["sentences_per_s"] for r in reps]),
                                         **{f"latency_{p}_ms": spread([r[mode]["latency_ms"][p] for r in reps])
                                            for p in ("p50", "p95", "p99")},
                                         "errors": sum(r[mode]["errors"] for r in reps)} for mode in reps[0]}
            for n in ("one", "many"):
                results["summary"][f"aiayn_over_libretranslate_{n}"] = spread(
                    [r[f"aiayn_{n}"]["sentences_per_s"] / r[f"libretranslate_{n}"]["sentences_per_s"] for r in reps])
            results["rss_mib"] = {"libretranslate": tree_rss_mib(lt.pid), "aiayn": tree_rss_mib(ours.pid)}
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print({k: v for k, v in results["summary"].items() if k.startswith("aiayn_over")}, results["rss_mib"])
    write_results(args.out or RESULTS / f"libretranslate-load-{cpu_kind()}-{args.precision}.json", results)


if __name__ == "__main__":
    main()
