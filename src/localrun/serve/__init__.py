"""`localrun serve`: the HTTP layer over the runtime. A request goes one way through it:

    routes/<dialect>  a handler of a few lines: read the body, translate it, hold the model, answer, write
    dialects/<name>   the dialect's pure translator: its wire body -> Asked; answer events -> its wire format
    asked             Asked, the one request every dialect makes, in localrun's own terms
    prepare           Asked + the model's facts (runtime.facts) -> the runtime Request, and how its calls are read
    stream            Answer (the request path `run` and `chat` take) and its events, one stream for every dialect
    endpoint          what every handler shares: refusals shaped, metrics, holding a model, whole or streamed
    errors            the refusals and the one table that gives each its status, code and field

and around it: app (the process: serve, bind, uvicorn), asgi (build_app), service (ServeOptions, Service: the
model pool), guards (API key, body cap, header timeout), checks (what translators share in checking a body),
stored (the Responses API's stored responses), wire (JSON, SSE, NDJSON), access (the access log), metrics.
"""
