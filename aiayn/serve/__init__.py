"""`aiayn serve`: an HTTP server that batches translation requests across clients
(aiayn.serve.batcher), and a page that shows the attention of §3.2 as Figures 3-5 of the paper do
(aiayn.serve.app). The defaults live here, where the CLI reads them without importing FastAPI."""

from aiayn.config import DECODE_PRESETS

# How long the decoding thread, once woken by a request, waits for others to join it. Under load
# the queue fills while a batch decodes, so this only costs a lone request a few milliseconds.
MAX_WAIT_MS = 5.0
MAX_WAIT_MS_LIMIT = 10_000.0  # the most --max-wait-ms may ask: a lone request waits that long at worst
BATCH_TOKENS = DECODE_PRESETS["translate"].batch_tokens  # source tokens × beam the search takes at once
# What one request may hold in memory (aiayn.serve.cost): the decoding state of one batch, and the
# attention maps of its answer. 256 MiB together, for any model.
MAX_BATCH_MIB = 128
MAX_ATTENTION_MIB = 128
MAX_QUEUE = 256  # texts waiting; more are refused with 503 rather than queued without bound
MAX_TEXTS = 64  # texts in one request
MAX_INPUT_TOKENS = 256  # tokens in one text: keeps a request's decoding time and attention maps bounded
DRAIN_SECONDS = 30.0  # a stopping server decodes what it can for this long, then answers the rest 503
# A request must arrive whole (headers and body) within this many seconds of its first byte, or of
# its connection's opening; a slower one gets 408 and its connection is closed.
READ_TIMEOUT = 10.0
MAX_CONNECTIONS = 256  # open connections; a new one over it first closes the idlest, else gets 503
