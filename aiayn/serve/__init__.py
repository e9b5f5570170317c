"""`aiayn serve`: an HTTP server that batches translation requests across clients
(aiayn.serve.batcher), and a page that shows the attention of §3.2 as Figures 3-5 of the paper do
(aiayn.serve.app). The defaults live here, where the CLI reads them without importing FastAPI."""

from aiayn.config import DECODE_PRESETS

# How long the decoding thread, once woken by a request, waits for others to join it. Under load
# the queue fills while a batch decodes, so this only costs a lone request a few milliseconds.
MAX_WAIT_MS = 5.0
BATCH_TOKENS = DECODE_PRESETS["translate"].batch_tokens  # source tokens × beam taken in one batch
MAX_QUEUE = 256  # texts waiting; more are refused with 503 rather than queued without bound
MAX_TEXTS = 64  # texts in one request
MAX_INPUT_TOKENS = 256  # tokens in one text: keeps a request's decoding time and attention maps bounded
DRAIN_SECONDS = 30  # a stopping server answers the requests in flight for this long, then closes
