"""Attention maps, as the paper's "Attention Visualizations" (Figures 3-5): for one sentence,
the weights of every head of every layer, for encoder self-attention, decoder self-attention
and encoder-decoder attention."""

from __future__ import annotations

import math
import os
import sys
import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from aiayn.files import atomic_dir

# The query of a decoder position whose step the search never took (found in review: named </s>).
CUT = "(cut)"
BASE_FONT = "DejaVu Sans"  # matplotlib's own, always there
KINDS = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "encoder-decoder attention"}


def plot_heads(weights: Tensor, queries: Sequence[str], keys: Sequence[str], title: str, path: Path) -> Path:
    """`heads_figure` written to the PNG file `path`."""
    fig = heads_figure(weights, queries, keys, title)  # chooses the Agg backend before pyplot loads
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def heads_figure(weights: Tensor, queries: Sequence[str], keys: Sequence[str], title: str):
    """One heatmap per head of weights (h, L_q, L_k) in a grid, rows = queries, columns = keys.
    Every head shares the same tokens, so only the grid's left column names the queries and its
    lowest head in each column names the keys: matplotlib lays out each label's text, which for a
    long sentence took seconds a head. One colour bar at the right gives the scale, the same for
    every head: a weight from 0 to 1 (each row sums to 1, §3.2.1's softmax)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = weights.size(0)
    columns = min(4, heads)
    rows = -(-heads // columns)
    cell = 0.22
    width = max(3.0, cell * len(keys) + 1.2)
    height = max(3.0, cell * len(queries) + 1.2)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False)
    for head, ax in enumerate(axes.flat):
        if head >= heads:
            ax.axis("off")
            continue
        image = ax.imshow(weights[head].float().numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(f"head {head + 1}", fontsize=9)
        lowest = head + columns >= heads
        if lowest:
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7, parse_math=False)  # a piece "$$" is text
        else:
            ax.set_xticks([])
        if head % columns == 0:
            ax.set_yticks(range(len(queries)), queries, fontsize=7, parse_math=False)
        else:
            ax.set_yticks([])
    bar = _lay_out(fig, title, rows, columns, keys, queries)
    colour_bar = fig.colorbar(image, cax=fig.add_axes(bar), ticks=[0, 0.5, 1])
    colour_bar.set_label("attention weight", fontsize=8)
    colour_bar.ax.tick_params(labelsize=7)
    return fig


def _lay_out(fig, title: str, rows: int, columns: int, keys: Sequence[str], queries: Sequence[str]) -> list[float]:
    """The figure's `title` at its top, and room for the tick labels and titles of
    `heads_figure`'s grid, from the measured extents of its texts: `tight_layout` finds the same
    by drawing the whole figure once more, most of whose time goes to laying out those labels.
    The axes are titled "query" (left) and "key" (below). Column 0 holds the queries' labels,
    the lowest head of each column the keys' (turned upright: as tall as they are wide; where
    the last row is short, over its empty cells), each head its title above it. Labels too long for the figure are cut at its edge rather than
    squeezing the heatmaps away. Returns the place [left, bottom, width, height] (fractions of the
    figure) of the colour bar, in the right margin kept for it and its labels."""
    renderer = fig.canvas.get_renderer()
    probe = fig.text(0, 0, "", parse_math=False)  # measured as drawn: pieces are text, never maths

    def inches(text: str, size: float) -> tuple[float, float]:  # (width, height) of `text` at `size` points
        probe.set_text(text)
        probe.set_fontsize(size)
        box = probe.get_window_extent(renderer)
        return box.width / fig.dpi, box.height / fig.dpi

    widest = lambda labels: max((inches(label, 7)[0] for label in set(labels)), default=0.0)  # noqa: E731
    keys_tall, queries_wide = widest(keys), widest(queries)
    head_title, suptitle, axis_title = inches("head 1", 9)[1], inches(title, 12)[1], inches("key", 9)[1]
    bar_labels = inches("0.5", 7)[0] + inches("attention weight", 8)[1]
    probe.remove()
    width, height = fig.get_size_inches()
    pad = 0.12  # inches: ticks and their gap to the labels, and a margin
    fig.suptitle(title, y=1 - pad / height, va="top", fontsize=12)
    left = min((queries_wide + 2 * pad) / width, 0.4) + (axis_title + pad) / width
    bottom = min((keys_tall + 2 * pad) / height, 0.4) + (axis_title + pad) / height
    bar_width = 0.12  # inches
    right, top = 1 - (bar_width + bar_labels + 4 * pad) / width, max(1 - (suptitle + head_title + 2 * pad) / height, bottom + 0.2)
    gap_x, gap_y = pad, head_title + pad
    spare_x, spare_y = (right - left) * width, (top - bottom) * height  # inches the axes and gaps share
    # Rows are the queries (the positions attending), columns the keys (§3.2.1's Q and K)
    fig.text(pad / width, (bottom + top) / 2, "query", rotation=90, ha="left", va="center", fontsize=9)
    fig.text((left + right) / 2, pad / height, "key", ha="center", va="bottom", fontsize=9)
    fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top,
                        wspace=gap_x * columns / (spare_x - (columns - 1) * gap_x),
                        hspace=gap_y * rows / (spare_y - (rows - 1) * gap_y))
    return [right + pad / width, bottom, bar_width / width, top - bottom]


@torch.no_grad()
def pair_attention(model, source_ids: Sequence[int], target_ids: Sequence[int]):
    """The attention maps (`Transformer.attention_maps`) of one sentence pair, teacher-forced:
    the encoder reads source + EOS, the decoder BOS + target. A translation the model produced
    gets the weights the search saw (cached decoding equals the full pass). Returns (maps,
    encoder input ids, decoder input ids)."""
    config = model.config
    src_ids = list(source_ids) + [config.eos_id]
    tgt_in = [config.bos_id] + list(target_ids)
    device = next(model.parameters()).device
    maps = model.attention_maps(torch.tensor([src_ids], device=device), torch.tensor([tgt_in], device=device))
    return maps, src_ids, tgt_in


def attention_figures(
    model, tokenizer, source: str, target_ids: Sequence[int], out_dir: Path, force: bool = False, cut: bool = False,
    note: Callable[[str], None] = lambda text: print(f"aiayn: note: {text}", file=sys.stderr),
) -> list[Path]:
    """Write the folder `out_dir` of `{kind}-layer{N}.png`, one for each kind of attention and each
    layer, for the sentence pair (source, target_ids); returns the paths. The folder is written
    whole and atomically; one that holds files is replaced only with `force`. A translation `cut`
    at the search's length limit ended without EOS: its last decoder row is named CUT. Pieces no
    installed font draws are named in one `note` (`label_fonts`)."""
    maps, src_ids, tgt_in = pair_attention(model, tokenizer.encode(source), target_ids)
    src_labels = [tokenizer.id_to_piece(i) for i in src_ids]
    # As the server's page names them: a decoder position's query by the token it produced (its
    # cross-attention row then reads as an alignment), its key by the token it was fed.
    produced = [tokenizer.id_to_piece(i) for i in target_ids] + [CUT if cut else tokenizer.id_to_piece(model.config.eos_id)]
    fed = [tokenizer.id_to_piece(i) for i in tgt_in]
    axes = {"encoder": (src_labels, src_labels), "decoder": (produced, fed), "cross": (produced, src_labels)}
    names = []

    families, undrawn = label_fonts([*src_labels, *produced, *fed])
    if undrawn:
        note(f"no installed font draws {undrawn[:20]}{'...' if len(undrawn) > 20 else ''}: those labels show as boxes "
             "(a Noto font draws them: apt-get install fonts-noto-core fonts-noto-cjk)")

    def build(folder: Path) -> None:
        import matplotlib

        with matplotlib.rc_context({"font.family": families}), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Glyph .* missing from")  # said once, above, not for every glyph
            for kind, layers in maps.items():
                queries, keys = axes[kind]
                for layer, weights in enumerate(layers, start=1):
                    title = f"{KINDS[kind]}, layer {layer} of {len(layers)}"
                    path = folder / f"{kind}-layer{layer}.png"
                    names.append(plot_heads(weights[0].cpu(), queries, keys, title, path).name)

    atomic_dir(out_dir, build, force)
    return [Path(out_dir) / name for name in names]


def label_fonts(labels: Sequence[str]) -> tuple[list[str], str]:
    """The font families to draw `labels` with, and the characters none of them draws.
    matplotlib's own DejaVu Sans first, then each installed font that draws characters of the
    labels the ones before lack (CJK, Devanagari, ...): matplotlib falls back along the list
    glyph by glyph (found in review: CJK pieces drew as empty boxes, with a warning a glyph)."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    families = [BASE_FONT]
    base = FT2Font(font_manager.findfont(BASE_FONT))
    missing = {c for label in labels for c in label if c.isprintable() and not c.isspace() and not base.get_char_index(ord(c))}
    for entry in font_manager.fontManager.ttflist:
        if not missing:
            break
        if entry.name in families or entry.name.startswith("Last Resort"):  # (its glyph for all: a box naming the script)
            continue
        try:
            font = FT2Font(entry.fname)
        except (OSError, RuntimeError):  # a font file matplotlib listed but cannot open
            continue
        if drawn := {c for c in missing if font.get_char_index(ord(c))}:
            families.append(entry.name)
            missing -= drawn
    return families, "".join(sorted(missing))


def _number(value) -> Optional[float]:
    """A log value as a finite float, or None: a record edited by hand may hold a string, a bool
    or an int too large for a float (found in review: an OverflowError, and True drawn as 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def loss_figure(records: Sequence[dict]):
    """Training and dev loss (of log records) against the step. A loss that is not finite (a
    diverged step) has no height: it is marked with an x on the top edge at its step, where it
    would otherwise vanish from the plot (found in review)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    for split, style, colour in (("train", "-", "C0"), ("dev", "o-", "C1")):
        # (found in review: a record without a loss, hand-added, was a KeyError at the end of training)
        logged = [(step, r.get("loss")) for r in records if r.get("split") == split
                  and (step := _number(r.get("step"))) is not None]
        points = [(step, number) for step, loss in logged if (number := _number(loss)) is not None]
        if points:  # one point of a line draws nothing: a short run's first record gets its marker
            ax.plot(*zip(*points), style if len(points) > 1 else "o", color=colour, label=f"{split} loss")
        if not_finite := [step for step, loss in logged if isinstance(loss, float) and not math.isfinite(loss)]:
            ax.plot(not_finite, [1.0] * len(not_finite), "x", color=colour, transform=ax.get_xaxis_transform(),
                    clip_on=False, label=f"{split} loss not finite")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    ax.set_xlabel("step")
    ax.set_ylabel("label-smoothed loss per target token")
    ax.grid(alpha=0.3)
    if ax.lines:  # a log with no record yet (stopped before its first) draws empty axes, without matplotlib's warning
        ax.legend(loc="lower left")  # a falling loss leaves it empty; the top edge holds the marks of diverged steps
    fig.tight_layout()
    return fig


def plot_losses(records: Sequence[dict], png_path: Path) -> None:
    """A run's loss.png: `loss_figure`, written atomically."""
    import matplotlib.pyplot as plt

    fig = loss_figure(records)
    tmp = png_path.with_name(f".{png_path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, png_path)
