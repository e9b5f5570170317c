// The page of `aiayn serve`: translate through POST /translate and draw the attention weights it
// returns (§3.2, Figures 3-5 of the paper) on a canvas. Everything is served by aiayn: no CDN.
"use strict";

const $ = (id) => document.getElementById(id);
const KIND_NAMES = { cross: "encoder-decoder attention", encoder: "encoder self-attention",
                     decoder: "decoder self-attention" };
// Viridis, as matplotlib draws `aiayn attention`: dark purple for 0, yellow for 1.
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
let details = [];
let lineOf = [];  // the input line of each text sent (blank lines are not sent)

function color(value) {
  const x = Math.min(1, Math.max(0, value)) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  const f = x - i;
  const rgb = VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
  return `rgb(${rgb.join(",")})`;
}

function fillSelect(select, options) {
  select.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
}

// The (queries, keys) labels of each kind: source pieces; decoder queries are the steps, named by
// the token each produced; decoder keys are the tokens fed in (the model's start token, then the
// outputs), as the server names them.
function axes(detail, kind) {
  const src = detail.source_tokens, tgt = detail.target_tokens, fed = detail.fed_tokens;
  return { cross: [tgt, src], encoder: [src, src], decoder: [tgt, fed] }[kind];
}

function draw() {
  const detail = details[Number($("sentence").value)];
  if (!detail) return;
  const kind = $("kind").value, layer = Number($("layer").value), head = $("head").value;
  const heads = detail.attention[kind][layer];
  const weights = head === "mean"
    ? heads[0].map((row, q) => row.map((_, k) => heads.reduce((sum, h) => sum + h[q][k], 0) / heads.length))
    : heads[Number(head)];
  const [queries, keys] = axes(detail, kind);
  const canvas = $("heatmap"), ctx = canvas.getContext("2d");
  const cell = Math.max(8, Math.min(28, Math.floor(900 / Math.max(keys.length, queries.length))));
  // A label no taller than its cell: 12px text on 8px rows overlaps its neighbours (found in a page hunt).
  const font = `${Math.min(12, cell)}px system-ui, sans-serif`;
  ctx.font = font;
  const labelWidth = (labels) => Math.max(...labels.map((t) => ctx.measureText(t).width)) + 8;
  const left = labelWidth(queries), top = labelWidth(keys);
  canvas.width = left + cell * keys.length + 8;
  canvas.height = top + cell * queries.length + 8;
  ctx.font = font;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  weights.forEach((row, q) => row.forEach((w, k) => {
    ctx.fillStyle = color(w);
    ctx.fillRect(left + k * cell, top + q * cell, cell, cell);
  }));
  ctx.fillStyle = "#1d1d1f";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  queries.forEach((t, q) => ctx.fillText(t, left - 4, top + q * cell + cell / 2));
  keys.forEach((t, k) => {
    ctx.save();
    ctx.translate(left + k * cell + cell / 2, top - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(t, 0, 0);
    ctx.restore();
  });
  const which = head === "mean" ? `mean of ${heads.length} heads` : `head ${Number(head) + 1}`;
  $("caption").textContent = `${KIND_NAMES[kind]}, layer ${layer + 1}, ${which}: ` +
    `rows are ${kind === "encoder" ? "source" : "target"} positions (queries), columns the positions they attend to.`;
  canvas.setAttribute("aria-label", `Attention heatmap, ${$("caption").textContent}`);
  canvas.dataset.drawn = `${kind}:${layer}:${head}`;
}

// The picker's name of each sentence: its input line, and where a line holds several, its place
// there ("2.3": the third sentence of line 2). The server splits lines into sentences (split_sentences).
function sentenceLabels(details) {
  const count = {}, seen = {};
  details.forEach((d) => { count[d.text] = (count[d.text] || 0) + 1; });
  return details.map((d) => {
    seen[d.text] = (seen[d.text] || 0) + 1;
    return count[d.text] > 1 ? `${lineOf[d.text]}.${seen[d.text]}` : `${lineOf[d.text]}`;
  });
}

function showAttention() {
  // A text the server found blank (its rule, Python's str.strip, is the only one) has no sentence.
  const labels = sentenceLabels(details);
  const drawable = details.map((d, i) => [d, i]).filter(([d]) => d.target_tokens.length);
  $("attention-section").hidden = !drawable.length;
  if (!drawable.length) return;
  const first = drawable[0][0];
  fillSelect($("sentence"), drawable.map(([, i]) => [i, labels[i]]));
  const layers = first.attention.cross.length, heads = first.attention.cross[0].length;
  fillSelect($("layer"), [...Array(layers).keys()].map((i) => [i, `${i + 1}`]));
  fillSelect($("head"), [["mean", "mean"], ...[...Array(heads).keys()].map((i) => [i, `${i + 1}`])]);
  $("layer").value = layers - 1;
  draw();
}

let busy = false;

// One POST /translate of `texts`, with the API key when the page was given one (`aiayn serve
// --api-keys`); the answer's body, or {} where it is no JSON (a proxy's error page).
async function post(texts, attention) {
  const headers = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  // An empty field is left out, so the server's default (§6.1) applies (found in review: an empty
  // α was sent as 0, the length penalty off).
  const settings = {};
  for (const id of ["beam", "alpha"]) if ($(id).value.trim() !== "") settings[id] = Number($(id).value);
  // What the browser could not read as a number ("1e", "-", 1e309) reads as "": not the default, an error.
  for (const id of ["beam", "alpha"]) if ($(id).validity.badInput) throw new Error(`${id}: not a number`);
  let response;
  try {
    response = await fetch("/translate", {
      method: "POST", headers,
      body: JSON.stringify({ text: texts, ...settings, attention, split_sentences: true }),
    });
  } catch (error) {  // no answer at all; not the page's own TypeErrors below (found in review)
    throw new Error(key && /[^\x00-\xff]/.test(key) ? "the API key holds characters a header cannot carry"
                                                    : "the server did not answer (is aiayn serve running?)");
  }
  const body = await response.json().catch(() => ({}));
  return [response, body];
}

async function translate() {
  if (busy) return;  // Ctrl+Enter while a translation runs: the older answer would land last
  // Each line is a sentence or a paragraph. Only empty lines are dropped here: whether a line is
  // blank is the server's call, so that the page and the API agree on lines of invisible
  // characters (JS trim and Python strip do not).
  const lines = $("source").value.split("\n").map((t, i) => [t, i + 1]).filter(([t]) => t !== "");
  const texts = lines.map(([t]) => t);
  if (!texts.length) {
    $("translations").replaceChildren();  // as under an error: no earlier answer under this one
    details = [];
    showAttention();
    setStatus("Type a sentence first.", true);
    return;
  }
  busy = true;
  setStatus("Translating…");
  const focused = document.activeElement === $("translate");  // disabled, it would lose the focus
  $("translate").disabled = true;
  try {
    let [response, body] = await post(texts, true);
    let note = "";
    // The maps of many sentences pass the server's --max-attention-mib: the translations come
    // without them (found in review: 20 verses got only the error).
    if (response.status === 413 && /attention maps/.test(body.error || "")) {
      note = `No attention maps: ${body.error}`;
      [response, body] = await post(texts, false);
    }
    if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
    if (!Array.isArray(body.translations) || body.translations.length !== texts.length) {
      throw new Error(`the server's answer (${response.status}) holds no translations`);
    }
    lineOf = lines.map(([, number]) => number);  // numbered by input line (found in review: blank lines shifted them)
    $("translations").replaceChildren(...body.translations.map((t, i) => {
      const item = document.createElement("li");
      item.value = lineOf[i];
      item.dir = "auto";  // an Arabic or Hebrew line laid out right to left, as in the text field
      item.textContent = t;
      return item;
    }));
    details = body.details || [];
    showAttention();
    const blank = body.translations.every((t) => t.trim() === "");  // a blank text comes back as it was
    // Said, not left empty: the status is the live region a screen reader hears the answer come by.
    const done = `Translated ${texts.length} line${texts.length === 1 ? "" : "s"}.`;
    setStatus(blank ? "Nothing to translate: the lines are blank." : note || done, blank);
  } catch (error) {
    // Nothing of the last answer stays under the error, as if it answered this text.
    $("translations").replaceChildren();
    details = [];
    showAttention();
    setStatus(`Error: ${error.message}`, true);
  } finally {
    busy = false;
    $("translate").disabled = false;
    if (focused) $("translate").focus();
  }
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

async function showInfo() {
  try {  // a server with --api-keys asks for one: the page then has a field for it
    const settings = await (await fetch("/frontend/settings")).json();
    $("key-label").hidden = !settings.keyRequired;
  } catch (error) { /* the page works without it */ }
  try {
    const info = await (await fetch("/info")).json();
    const m = info.model;
    $("model-info").textContent = `${info.source || "model"}: N=${m.n_layers}, d_model=${m.d_model}, ` +
      `h=${m.n_heads}, ${info.parameters.toLocaleString()} parameters, ${info.precision} on ${info.device}`;
  } catch (error) { /* the page works without it */ }
}

$("translate").addEventListener("click", translate);
$("source").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translate(); });
for (const id of ["sentence", "kind", "layer", "head"]) $(id).addEventListener("change", draw);
showInfo();
