"""Compile evaluate's programs for a target and read what XLA says about them.

:func:`plan` compiles each program of :func:`alodlm_jax.plan.programs.evaluate_programs` for a
:class:`~alodlm_jax.plan.targets.Target` (compile-only devices for a named accelerator) and
returns the plan record (``docs/plan.md`` describes every key):

* ``compile_seconds``: wall time of ``lower(...).compile()`` on this machine;
* ``program_bytes``: size of the optimized program's text; ``fusions``: its fusion instructions
  (every branch once);
* memory from ``memory_analysis()``: ``argument_bytes`` (of which ``weight_bytes``,
  ``cache_bytes``), ``output_bytes``, ``alias_bytes``, ``temp_bytes``; ``device_memory_bytes`` =
  arguments + outputs - aliased + temporaries + generated code (the buffer assignment the
  executable allocates by), against ``usable_bytes``, what a JAX process gets of the device's
  ``capacity_bytes`` (``fits``; :func:`alodlm_jax.plan.fit.usable_memory`);
  ``beyond_arguments_bytes``: the part beyond the arguments (:func:`_beyond_arguments`);
* per step (the batch program's loop body; the single-request program's pass):
  ``bytes_per_step`` and ``kernels_per_step`` from the optimized program
  (:mod:`alodlm_jax.plan.hlo`: every loop counted as often as it runs, the heaviest branch of
  every switch); ``floor_bytes_per_step`` (:func:`floor_bytes`); ``steps_per_second`` and
  ``request_passes_per_second``: what ``bytes_per_step`` allows at the target's bandwidth;
* ``xla_cost``: XLA's own ``cost_analysis()`` where the backend gives one (XLA:TPU, XLA:CPU),
  whose loop bodies count once;
* on a GPU (:mod:`alodlm_jax.plan.launches`, from XLA's thunks after its command-buffer pass),
  per step: ``kernels_outside_command_buffers`` (launched one by one by the host),
  ``command_buffer_launches``, ``kernels_in_command_buffers``, ``host_syncs``,
  ``step_in_command_buffer``; and everywhere ``flops_per_step`` (the matrix products) and
  ``predicted_step_seconds`` (:func:`alodlm_jax.plan.launches.predicted_step_seconds`).

The programs are compiled with the engine's XLA options
(:func:`alodlm_jax.decode.programs.compiler_options`: command buffers on a GPU), or with XLA's
defaults (``command_buffers="xla"``); ``xla_options`` in the record says which.

Before compiling, :func:`alodlm_jax.plan.fit.check` refuses a plan whose arguments alone exceed
the usable memory (:class:`~alodlm_jax.plan.fit.DoesNotFit`). ``max_batch_size`` (top level):
the largest batch whose batch and admit programs fit (:func:`alodlm_jax.plan.fit.largest_batch`),
one figure whatever batch is planned.
"""

from __future__ import annotations

import math
import time

import jax

from alodlm_jax.network.params import per_layer_weights
from alodlm_jax.plan import fit, hlo, launches
from alodlm_jax.plan.programs import PlannedProgram, evaluate_programs, place

__all__ = ["plan", "floor_bytes", "PROGRAM_KEYS"]

PROGRAM_KEYS = ("name", "compile_seconds", "program_bytes", "argument_bytes", "temp_bytes",
                "device_memory_bytes", "capacity_bytes", "fits", "bytes_per_step",
                "floor_bytes_per_step", "kernels_per_step")


def floor_bytes(cfg, params_spec, bucket, batch: int, *, prelude: bool = True) -> int:
    """What one step must move at least (the floor of ``batched.step_analysis``): every weight it
    multiplies once (all but the embedding, which is read by rows), and each request's K/V for the
    bucket's cache slots at one depth of every layer plus its window rows written back. Without
    ``prelude`` (the single-request program's step, one recurrent pass: a window runs its prelude
    once, outside the passes), the prelude's layers are left out."""
    item = jax.numpy.dtype(params_spec["embed"].dtype).itemsize
    skipped = {"['embed']"} | (set() if prelude else {"['prelude']"})
    weights = sum(math.prod(x.shape) * jax.numpy.dtype(x.dtype).itemsize
                  for path, x in jax.tree_util.tree_leaves_with_path(params_spec)
                  if jax.tree_util.keystr(path[:1]) not in skipped)
    row_kv = cfg.num_key_value_heads * cfg.head_dim * item
    layers = (cfg.num_prelude_layers if prelude else 0) + cfg.num_core_layers + cfg.num_coda_layers
    return int(weights + 2 * batch * layers * row_kv * (bucket.t_max + bucket.rows))


def _device_memory(memory) -> int:
    """What an executable allocates (its ``memory_analysis()``): arguments + outputs - aliased +
    temporaries + generated code."""
    return (int(memory.argument_size_in_bytes) + int(memory.output_size_in_bytes)
            - int(memory.alias_size_in_bytes) + int(memory.temp_size_in_bytes)
            + int(memory.generated_code_size_in_bytes))


def _beyond_arguments(memory, shapes_total: int) -> int:
    """What an executable allocates beyond its arguments (``shapes_total``: their bytes as their
    shapes give them): the larger of two lower bounds, its device memory less ``shapes_total``
    (which counts a layout's padding, but also arguments JAX leaves out of a program that does
    not read them: an admit program's LM head) and its outputs not aliased, temporaries and
    code (which count no padding)."""
    return max(_device_memory(memory) - shapes_total,
               _device_memory(memory) - int(memory.argument_size_in_bytes))


def _analyse(program: PlannedProgram, compiled, seconds: float, target, floor: int,
             usable: int | None, thunks: tuple[str, str] | None = None) -> dict:
    memory = compiled.memory_analysis()
    text = compiled.as_text() or ""
    module = hlo.parse(text)
    step = hlo.step_cost(module, program.step_depth) if program.step_depth else None
    step_launches = None
    if step is not None and thunks is not None:
        loop = hlo.step_loop(module, program.step_depth)
        step_launches = launches.step_launches(module, loop and loop.name, *thunks)
    whole = hlo.program_cost(module)
    need = fit.argument_bytes(program)
    arguments = int(memory.argument_size_in_bytes)
    device_memory = _device_memory(memory)
    capacity = target.capacity_bytes
    bandwidth = target.bandwidth_bytes_per_second
    record = {
        "name": program.name,
        "compile_seconds": round(seconds, 3),
        "program_bytes": len(text.encode()),
        "fusions": hlo.count_fusions(text),
        "argument_bytes": arguments,
        "weight_bytes": need["weights"],
        "cache_bytes": need["cache"],
        "output_bytes": int(memory.output_size_in_bytes),
        "alias_bytes": int(memory.alias_size_in_bytes),
        "temp_bytes": int(memory.temp_size_in_bytes),
        "generated_code_bytes": int(memory.generated_code_size_in_bytes),
        "device_memory_bytes": device_memory,
        "capacity_bytes": capacity,
        # Against what a JAX process gets of the device (fit.usable_memory).
        "fits": None if usable is None else device_memory <= usable,
        "batch": program.batch,
        "bytes_per_step": None if step is None else step.bytes,
        "floor_bytes_per_step": floor if program.step_depth else None,
        "kernels_per_step": None if step is None else step.kernels,
        "loops_of_unknown_trip_count_in_step": None if step is None else step.unknown,
        "bytes_per_run": whole.bytes,
        "kernels_per_run": whole.kernels,
        "steps_per_second": None,
        "request_passes_per_second": None,
        "xla_cost": _xla_cost(compiled),
    }
    if step is not None and step.bytes and bandwidth:
        record["steps_per_second"] = bandwidth / step.bytes
        record["request_passes_per_second"] = program.batch * bandwidth / step.bytes
    record.update(_launch_record(step, step_launches, target))
    # And what it needs beyond its arguments (temporaries, outputs not aliased, generated code).
    record["usable_bytes"] = usable
    record["beyond_arguments_bytes"] = _beyond_arguments(memory, need["total"])
    return record


LAUNCH_KEYS = ("flops_per_step", "kernels_outside_command_buffers", "command_buffer_launches",
               "kernels_in_command_buffers", "host_syncs", "step_in_command_buffer",
               "few_programs_seconds", "predicted_step_seconds")


def _launch_record(step, step_launches: dict | None, target) -> dict:
    """The step's FLOPs, launches (GPU) and predicted time (module docstring)."""
    record = dict.fromkeys(LAUNCH_KEYS)
    if step is None:
        return record
    record["flops_per_step"] = step.flops
    if step_launches is not None:
        record.update({k: step_launches[k] for k in LAUNCH_KEYS if k in step_launches})
    bandwidth = target.bandwidth_bytes_per_second
    if bandwidth:
        record["few_programs_seconds"] = launches.few_programs_seconds(step.few_programs, bandwidth)
    record["predicted_step_seconds"] = launches.predicted_step_seconds(
        step.bytes, step.flops, step_launches, step.kernels, bandwidth,
        getattr(target, "matrix_flops_per_second", None), record["few_programs_seconds"] or 0.0)
    return record


def _refused(program: PlannedProgram, seconds: float, target, floor: int, usable: int | None,
             error) -> dict:
    """A program the target's compiler refused for want of memory (XLA:TPU checks its memory
    assignment against the HBM): it does not fit; ``device_memory_bytes`` is its arguments alone
    (a lower bound) and ``compile_error`` XLA's message."""
    need = fit.argument_bytes(program)
    arguments = need["total"]
    record = dict.fromkeys(("program_bytes", "fusions", "output_bytes", "alias_bytes", "temp_bytes",
                            "generated_code_bytes", "bytes_per_step", "kernels_per_step",
                            "loops_of_unknown_trip_count_in_step", "bytes_per_run",
                            "kernels_per_run", "steps_per_second", "request_passes_per_second",
                            "xla_cost") + LAUNCH_KEYS)
    record.update(name=program.name, compile_seconds=round(seconds, 3), argument_bytes=arguments,
                  weight_bytes=need["weights"], cache_bytes=need["cache"],
                  device_memory_bytes=arguments, capacity_bytes=target.capacity_bytes, fits=False,
                  batch=program.batch, floor_bytes_per_step=floor if program.step_depth else None,
                  compile_error=str(error).strip().splitlines()[0], usable_bytes=usable)
    return record


def _xla_cost(compiled) -> dict | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - backends without a cost model
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost:
        return None
    return {k: float(cost[k]) for k in ("flops", "bytes accessed", "transcendentals") if k in cost}


def plan(target, cfg, params_spec, decode, *, prompt_tokens: int, batch_size: int, mesh_spec=None,
         programs=None, batch_programs: bool = False, save_hlo: str | None = None,
         log=None, shapes: str | None = None, command_buffers: str = "engine") -> dict:
    """Compiles evaluate's programs for ``target`` and returns the plan record (module
    docstring). ``mesh_spec``: an :class:`alodlm_jax.network.sharding.MeshSpec` over the target's
    devices (None: one device). ``log(text)`` hears about each compile as it starts.
    ``shapes``: the programs' shape policy (:mod:`alodlm_jax.network.rows`), by default the one the
    engine picks on the target's platform. ``command_buffers``: ``"engine"`` compiles with the
    engine's XLA options (XLA's defaults), ``"xla"`` with XLA's defaults, ``"graphs"`` with
    loops and branches in command buffers too (:func:`alodlm_jax.decode.programs.compiler_options`)."""
    from alodlm_jax.network import rows as R
    from alodlm_jax.decode.layout import for_mesh
    from alodlm_jax.decode.programs import compiler_options

    if command_buffers not in ("engine", "xla", "graphs"):
        raise ValueError("command_buffers must be 'engine', 'xla' or 'graphs', not "
                         f"{command_buffers!r}")
    usable, usable_basis = fit.usable_memory(target)
    meshed = mesh_spec is not None and mesh_spec.num_devices > 1
    # A named accelerator's compile-only devices come after the capacity check (fit.check): a
    # plan that cannot fit is refused from the shapes alone.
    devices = target.devices() if meshed or target.kind not in ("gpu", "tpu") else None
    platform = devices[0].platform if devices else target.kind
    gpu = platform in ("gpu", "cuda", "rocm")
    options = ({} if command_buffers == "xla" else
               compiler_options(platform, graphs=command_buffers == "graphs"))
    shapes = shapes or R.shapes_for(platform, 1 if mesh_spec is None else mesh_spec.num_devices)
    layout = None
    data = 1
    stacked = not per_layer_weights(platform)
    if meshed:
        from alodlm_jax.network import sharding as SH

        mesh = SH.make_mesh(mesh_spec, devices)
        layout = for_mesh(mesh)
        params_spec = _sharded_params(params_spec, mesh, cfg)
        data = mesh_spec.data
        stacked = True
    elif stacked:
        params_spec = _stacked_params(params_spec, cfg)
    names = programs

    def programs_at(batch: int, with_batch_programs: bool):
        return evaluate_programs(cfg, params_spec, decode, prompt_tokens=prompt_tokens,
                                 batch_size=batch, layout=layout,
                                 batch_programs=with_batch_programs, shapes=shapes)

    programs, bucket = programs_at(batch_size, batch_programs)
    linear = fit.per_request(lambda batch: programs_at(batch, True)[0], data)
    fit.check([p for p in programs if names is None or p.name in names], linear, target, usable,
              usable_basis, data)
    devices = devices or target.devices()
    records = []
    for program in programs:
        if names is not None and program.name not in names:
            continue
        args = program.args if layout is not None else place(program.args, devices[0])
        # The single-request program's step is one pass (no prelude); a batch step's heaviest
        # branch opens every window (prelude included).
        floor = floor_bytes(cfg, params_spec, bucket, program.batch,
                            prelude=program.step_depth != 2)
        if log:
            log(f"compiling {program.name} (batch {program.batch}) for {target.name}")
        start = time.perf_counter()
        try:
            compiled, thunks = _compile(program, args, options, dump=gpu, device=devices[0])
        except jax.errors.JaxRuntimeError as error:
            if "RESOURCE_EXHAUSTED" not in str(error):
                raise
            records.append(_refused(program, time.perf_counter() - start, target, floor, usable,
                                    error))
            continue
        seconds = time.perf_counter() - start
        records.append(_analyse(program, compiled, seconds, target, floor, usable, thunks))
        if save_hlo:
            import gzip
            import pathlib

            path = pathlib.Path(save_hlo) / f"{program.name}.hlo.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(path, "wt", encoding="utf-8") as handle:
                handle.write(compiled.as_text() or "")
        del compiled
    # What a batch needs beyond its arguments: the batch and admit programs' own figures; planned
    # at batch 1 (the single-request programs, which a batch never runs), the admit program's at
    # the smallest batch, compiled for that alone (one request's prefill: it hardly grows with the
    # batch, docs/plan.md "Memory").
    beyond = {r["name"]: r["beyond_arguments_bytes"] for r in records
              if r["name"] in ("batch", "admit") and "beyond_arguments_bytes" in r}
    memory = None
    if not beyond and usable is not None and not any("compile_error" in r for r in records):
        (admit,) = [p for p in programs_at(2 * data, True)[0] if p.name == "admit"]
        if log:
            log(f"compiling admit (batch {admit.batch}) for {target.name}: what a batch needs "
                f"beyond its arguments")
        args = admit.args if layout is not None else place(admit.args, devices[0])
        try:
            with lowering_for(devices[0]):
                lowered = admit.jitted.lower(*args, **admit.kwargs)
            memory = lowered.compile().memory_analysis()
        except jax.errors.JaxRuntimeError as error:  # XLA:TPU: not even that batch fits
            if "RESOURCE_EXHAUSTED" not in str(error):
                raise
            memory = None
    if memory is not None:
        beyond["admit"] = _beyond_arguments(memory, fit.argument_bytes(admit)["total"])
    extra = max(beyond.values(), default=0)
    return {
        "target": target.record(),
        "device": f"{devices[0].platform}: {devices[0].device_kind}",
        "model": {k: getattr(cfg, k) for k in ("num_hidden_layers", "hidden_size",
                                               "intermediate_size", "num_attention_heads",
                                               "num_key_value_heads", "head_dim", "vocab_size",
                                               "max_depth")},
        "dtype": str(params_spec["embed"].dtype),
        "batch_size": batch_size,
        "mesh": None if mesh_spec is None else {"data": mesh_spec.data, "model": mesh_spec.model},
        # As evaluate loads them (params.per_layer_weights): per-layer arrays on one CPU or GPU,
        # stacked layer groups on a TPU and on a mesh.
        "layer_layout": "stacked" if stacked else "per-layer",
        # Row and attention buckets (XLA:CPU), or one fixed shape (accelerators; with the attention
        # kernel on one device): rows.shapes_for.
        "shapes": shapes,
        "prompt_tokens": prompt_tokens,
        "bucket": {"prompt_bucket": bucket.prompt_bucket, "window_size": bucket.window_size,
                   "capacity": bucket.capacity, "cache_slots": bucket.t_max},
        "mode": decode.mode,
        "max_new_tokens": decode.max_new_tokens,
        "programs": records,
        "fits": all(r["fits"] is not False for r in records),
        "usable_bytes": usable,
        "usable_basis": usable_basis,
        "max_batch_size": fit.largest_batch(linear, usable, extra, data),
        "max_batch_size_basis": (
            f"the batch and admit programs' arguments from their shapes, plus {extra / 1e9:.2f} GB "
            f"beyond them (the most of {' and '.join(sorted(beyond)) or 'none compiled'})"),
        "batch_beyond_arguments_bytes": beyond,
        "jax": jax.__version__,
        "xla_options": options,
    }


def lowering_for(device):
    """A context for lowering a program for ``device``, one of a target's devices: JAX's default
    device for a compile-only GPU. Pallas's Triton lowering (JAX 0.11 and later) takes the GPU's
    kind, and so the kernels' compute capability, from the default device, which without a GPU
    is the CPU ("Unsupported GPU device kind"); JAX 0.10 fell back to sm_90 there."""
    import contextlib

    if getattr(device, "platform", None) in ("gpu", "cuda", "rocm"):
        return jax.default_device(device)
    return contextlib.nullcontext()


def _compile(program: PlannedProgram, args, options: dict, *, dump: bool, device=None):
    """``(compiled, thunks)``: the program compiled with XLA ``options``; with ``dump`` (XLA:GPU)
    also XLA's thunk sequence after its thunk passes and the thunks' metadata
    (:func:`alodlm_jax.plan.launches.read_dump`), written to a temporary directory (the dump's
    time is part of the compile seconds). The dump's options are not part of the program.
    ``device``: the target device it is lowered for (:func:`lowering_for`)."""
    with lowering_for(device):
        lowered = program.jitted.lower(*args, **program.kwargs)
    if not dump:
        return lowered.compile(compiler_options=options or None), None
    import tempfile

    with tempfile.TemporaryDirectory(prefix="alodlm-plan-") as directory:
        compiled = lowered.compile(compiler_options=dict(options, xla_dump_to=directory))
        return compiled, launches.read_dump(directory)


def _stacked_params(params_spec, cfg):
    """The abstract params with each layer group stacked on a leading layer axis (one
    ``lax.scan`` in the programs), as a TPU or a mesh run loads them."""
    from alodlm_convert.mapping import layer_shapes
    from alodlm_jax.network import sharding as SH

    dtype = params_spec["embed"].dtype
    sizes = {"prelude": cfg.num_prelude_layers, "core": cfg.num_core_layers,
             "coda": cfg.num_coda_layers}
    stacked = dict(params_spec)
    for group in SH.LAYER_GROUPS:
        stacked[group] = {key: jax.ShapeDtypeStruct((sizes[group],) + tuple(shape), dtype)
                          for key, shape in layer_shapes(cfg).items()}
    return stacked


def _sharded_params(params_spec, mesh, cfg):
    """The abstract params as a mesh run loads them (:func:`alodlm_jax.network.sharding.load_sharded_model`:
    stacked, :func:`_stacked_params`), with the mesh's shardings (the rules of
    :mod:`alodlm_jax.network.sharding`)."""
    from jax.sharding import NamedSharding

    from alodlm_jax.network import sharding as SH

    SH.check_divisibility(cfg, SH.model_axis_size(mesh))
    return jax.tree_util.tree_map(
        lambda x, spec: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec)),
        _stacked_params(params_spec, cfg), SH.param_specs())
