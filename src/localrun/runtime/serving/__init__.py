"""What a server keeps and runs (the `localrun serve` process and the background server behind `run` and
`chat`): the resident models (pool: loaded by name, kept for their keep-alive, evicted when the next would not
fit), the continuous-batching scheduler that answers many requests from one context (scheduler), what a server
starts for each model it loads (runner), and the requests the command line sends to a resident model (resident).
The request path itself (runtime.request, runtime.generate) is the one an in-process run takes."""
