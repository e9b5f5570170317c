"""`aiayn serve`: an HTTP server that batches translation requests across clients
(aiayn.serve.batcher), and a page that shows the attention of §3.2 as Figures 3-5 of the paper do
(aiayn.serve.app). Its defaults and limits are the fields of `aiayn.config.ServeOptions`."""
