"""The run around a script's training loop, for any script that keeps utils/contract.py: the
command line, ahead-of-time compilation with --load-model and --resume, the run directory, its
TensorBoard log, the learning curve and clock, checkpoints, Ctrl-C, the final evaluation and its
pictures, the model file and summary.json.

A script's `main` reads: `args = parse_args(script)`, the environment, `agent = make_agent(...)`,
then `with Run(script, args, agent, env, env_params) as run:` its loop over `run.iterations()`
calling `state, metrics = run.update_step(state)`, `log_iteration` and `end_iteration`, and after
it `finish`, `evaluate` and `save_model`. The update step takes over the state it is given (JAX's
donation): the new state is written into the old one's memory, which is gone after the call.

On a GPU or TPU the host reads an iteration's metrics one iteration late: `update_step` only
queues the step on the device and returns, and `log_iteration` logs the iteration before, whose
metrics are ready by then, while the device runs this one; the device never waits for the host's
logging. What is logged, checkpointed and evaluated, and where Ctrl-C or a non-finite step stops,
is what it would be if each step were read before the next began, as it is on a CPU, where the
host's work would share the cores with the step's (`end_iteration` reads it there)."""

import concurrent.futures
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from utils import checkpoint, cli, contract, evaluation, logger, model, parallel, startup, visualize
from utils.checkpoint import Checkpointer, Progress, fresh_start, read_checkpoint_args
from utils.contract import RESUME_MAY_CHANGE

# The one line a script written to log_iteration's earlier form gets (CHANGELOG.md, 2026-12-06).
EARLIER_LOG_ITERATION = (
    "Run.log_iteration(iteration, metrics, scalars, first_non_finite) takes the update step's "
    "metrics as they are (no jax.device_get) and two functions of them once read: scalars(m) -> "
    "{tag: value} and first_non_finite(m) -> the name of what went non-finite; the run stops "
    "itself there, and stop_non_finite is gone (CHANGELOG.md, \"log_iteration reads the metrics "
    "itself\")")
STARTED = time.time()  # the clock of summary.json's wall_seconds, reset by parse_args

# A copy of arrays on their device, in one program: what the host keeps of a state before the
# next update step takes over its memory.
copy_tree = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


class Pending(NamedTuple):
    """An iteration queued on the device whose metrics the host has not read yet."""
    iteration: int
    metrics: dict  # the update step's metrics, arrays on the device
    scalars: Callable[[dict], dict]  # the script's TensorBoard scalars of the metrics
    first_non_finite: Callable[[dict], str]  # what the script names if the iteration is not finite
    params_before: Any  # a copy of the parameters the iteration started from
    state: Any = None  # a copy of the state it left, where a checkpoint is due
    params: Any = None  # a copy of the parameters it left, where --eval-every plays them


def script_name(script) -> str:
    """A script's name: its file name without .py."""
    return os.path.splitext(os.path.basename(script.__file__))[0]


def take_saved_args(script, args, given: set[str]) -> str | None:
    """--load-model takes the network's arguments (the script's NETWORK_ARGS) from the model file's
    header, --resume all the run's arguments from its checkpoint; a flag given explicitly must
    agree. An error, or None."""
    before = getattr(script, "ADDED_ARGS", {})
    try:
        if args.resume and args.load_model:
            return "--resume continues training and --load-model only evaluates: give one of them"
        if args.load_model:
            model.check_writer(args.load_model, script_name(script),
                               {f.name for f in dataclasses.fields(script.Args)})
            saved = model.read_network_args(args.load_model, script.NETWORK_ARGS, before)
            return cli.adopt(args, saved, given, f"{args.load_model} was trained")
        if args.resume:
            saved = read_checkpoint_args(script.__file__, args.resume)
            return cli.adopt(args, saved, given, f"{args.resume} was run", RESUME_MAY_CHANGE)
    except ValueError as e:
        return str(e)
    return None


def parse_args(script, argv: list[str] | None = None):
    """The script's Args from the command line, or one `error:` line and exit 2: --load-model and
    --resume bring the arguments they were saved with, otherwise the game's row of the script's
    GAME_DEFAULTS and its `fill_defaults` (each if any) fill what the command line leaves; then the
    script's checks and the shared ones, the runtime fields (contract.fill_runtime_fields), and
    JAX's precision and compilation cache."""
    global STARTED
    STARTED = time.time()

    def take_saved(args, given: set[str]) -> str | None:
        if "exp_name" not in given:
            args.exp_name = args.exp_name or script_name(script)
        if args.load_model or args.resume:
            return take_saved_args(script, args, given)
        for name, value in getattr(script, "GAME_DEFAULTS", {}).get(args.env_id, {}).items():
            if name not in given:  # the game's row, where the command line leaves the field
                setattr(args, name, value)
        if hasattr(script, "fill_defaults"):
            script.fill_defaults(args, given)
        return None

    def check(args) -> str | None:
        return cli.check_run_args(args) or script.check_args(args)

    args = cli.parse_args(script.Args, check, script.__doc__.split("\n\n")[0], argv, take_saved)
    cli.or_exit(contract.fill_runtime_fields, script, args)
    startup.configure_jax(args.jax_cache_dir)
    return args


class Run:
    """A run of `script` with `args`: made, it has compiled the agent's update step (run by
    `update_step(state)`) and the final evaluation, and holds the state training starts from
    (`state`: fresh, or --resume's checkpoint; None with --load-model, whose parameters it holds).
    `with run:` opens its directory (new, or --resume's), log, summary.json and signal handlers; in
    the loop, `log_iteration` and `end_iteration` keep the books of each iteration, `finish` those
    of training; on leaving, summary.json is written however the run ended, and `exit_code` says
    how."""

    # The final evaluation compiles in a thread while training runs (True), and the initial state
    # while the update step compiles, or each before the next step (False); None: beside on a GPU
    # or TPU, whose host idles while the device works, before on a CPU, whose cores training takes.
    evaluation_beside_training: bool | None = None

    def __init__(self, script, args, agent, env, env_params):
        self.script, self.args, self.agent = script.__file__, args, agent
        self.params = None  # --load-model's; after a non-finite stop, those from before it
        self.pending = self.params_before = None  # the iteration not read yet; its start's params
        # On a CPU the host's reading shares the cores with the step's work, which it slowed (PPO
        # 0.86-0.94x): there each iteration is read as soon as it is queued, as before.
        self.late = jax.devices()[0].platform != "cpu"
        self.beside_training = (self.late if self.evaluation_beside_training is None
                                else self.evaluation_beside_training)
        self.status = None  # how training ended: completed, interrupted or non_finite
        self.summary = None  # summary.json's contents, from the run's start
        self.headline = script.HEADLINE_POLICY
        self.network_args = script.NETWORK_ARGS
        compile_start = time.time()
        self.start = self.compile(script, env, env_params)
        self.compile_seconds = time.time() - compile_start
        self.history, self.elapsed = self.start.history, self.start.train_seconds
        self.iteration = self.start.iteration  # the last finite iteration
        self.recent_return = self.history.returns[-1] if self.history.returns else float("nan")
        self.every_tenth = max(1, args.num_iterations // 10)

    def compile(self, script, env, env_params) -> Progress:
        """Reads --load-model's parameters or --resume's checkpoint (a file that cannot be used
        stops the run with one error line), makes the initial state otherwise, and compiles the
        update step and the final evaluation ahead of time: before the run directory exists and
        before the clock for SPS starts. Where training starts."""
        args, agent = self.args, self.agent
        runner_key, eval_key = jax.random.split(jax.random.key(args.seed))
        start, self.state = fresh_start(), None
        obs = jax.eval_shape(env.reset, runner_key, env_params)[0]
        # The final evaluation keeps each episode's last observation and numbers, four times.
        evaluation_bytes = 4 * args.eval_episodes * (obs.size * obs.dtype.itemsize + 64)
        cli.or_exit(cli.check_memory, f"--eval-episodes {args.eval_episodes}",
                    jax.ShapeDtypeStruct((evaluation_bytes,), np.uint8))
        if args.load_model:
            self.params = cli.or_exit(model.load_params, args.load_model, agent.network, obs, args,
                                      script.NETWORK_ARGS, getattr(script, "ADDED_ARGS", {}))
        else:
            # One device runs the update step a reader follows; more run the script's own
            # data-parallel version of it, where it has one.
            if args.num_devices > 1 and agent.parallel_update_step is None:
                cli.fail(f"--num-devices {args.num_devices}: {os.path.basename(self.script)} runs "
                         f"on one device (its make_agent hands over no parallel_update_step)")
            if args.num_devices > 1:
                mesh = parallel.make_mesh(args.num_devices)
                shardings = parallel.shardings(mesh, agent.state_specs)
                init = jax.jit(agent.init, out_shardings=shardings)
                step = agent.parallel_update_step(mesh)
            else:
                shardings, init, step = None, jax.jit(agent.init), agent.update_step
            # The state is donated: each step writes the new state into the old one's memory, so
            # that a run holds one state (a replay buffer once, not twice) and allocates none anew.
            step = jax.jit(step, donate_argnums=0)
            # Compiled from the state's shapes, and its memory checked, before any is allocated.
            like = jax.eval_shape(init, runner_key)
            cli.or_exit(cli.check_memory, "training", like)
            # Beside training (an accelerator's way), the initial state compiles and is made in a
            # thread while the update step compiles.
            initial = (startup.in_background(lambda: init(runner_key))
                       if self.beside_training and not args.resume else None)
            self.compiled_step = step.lower(like).compile()
            startup.release_freed_memory()  # the compiler's, before the evaluation's compile
            cli.or_exit(cli.check_memory, "training", like, self.compiled_step)
            if args.resume:  # read before anything is written
                self.state, start = cli.or_exit(checkpoint.load_checkpoint, self.script,
                                                args.resume, like, shardings)
            else:
                self.state = initial.result() if initial else init(runner_key)
        # From the parameters' shapes: training takes over (donates) the arrays themselves.
        params_like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                   self.parameters(self.state))

        def compile_evaluation() -> Callable:
            play = evaluation.compile_final_evaluation(
                env, args.env_id, env_params, agent.act, args.eval_episodes, args.num_devices,
                eval_key, params_like)
            startup.release_freed_memory()  # what the compiler used
            return play

        # With --load-model no training hides the compile.
        beside = self.beside_training and not args.load_model
        self._play = startup.in_background(compile_evaluation) if beside else compile_evaluation()
        return start

    @property
    def play(self) -> Callable:
        """The compiled final evaluation (compile_final_evaluation's play); where it compiles beside
        training, the first call waits for it, and the wait counts in compile_seconds."""
        if isinstance(self._play, concurrent.futures.Future):
            waited = time.time()
            self._play = self._play.result()
            self.compile_seconds += time.time() - waited
            if self.summary is not None:  # made once the run has begun
                self.summary["compile_seconds"] = self.compile_seconds
        return self._play

    def __enter__(self) -> "Run":
        args = self.args
        self.run_dir = args.resume or cli.make_run_dir(
            f"{args.env_id}__{args.exp_name}__{args.seed}")
        # What trained, for the run's figures: "TPU v5 lite x 1", and with the host's CPU, which
        # a table of runs collected on another machine names (tools/results_table.py)
        devices = jax.devices()[:args.num_devices or 1]
        self.summary = cli.RunSummary(self.run_dir, args, STARTED, env_id=args.env_id,
                                      seed=args.seed, total_timesteps=args.total_timesteps,
                                      policy=self.headline, compile_seconds=self.compile_seconds,
                                      device=f"{devices[0].device_kind} x {args.num_devices}",
                                      machine=cli.machine(devices), **cli.env_vars())
        start_step = self.start.iteration * args.steps_per_iteration
        self.log = logger.RunLog(self.run_dir, start_step,
                                 start_step + 1 if args.resume else None)
        if not args.resume:
            self.log.add_text("hyperparameters", logger.hyperparameters_text(args))
        self.checkpoints = None
        if args.checkpoint_every and not args.load_model:
            self.checkpoints = Checkpointer(self.script, self.run_dir, args, self.log)
        self.summary.__enter__()
        self.stop = cli.StopSignals().__enter__()
        if args.load_model:
            print(f"{args.env_id}: evaluating {args.load_model}; compiled in "
                  f"{self.compile_seconds:.1f}s; logging to {self.run_dir}")
            self.summary.update(status="completed", global_step=0, load_model=args.load_model)
        else:
            resumed = f"; resumed at step {start_step:,}" if args.resume else ""
            print(f"{args.env_id}: {args.num_iterations} iterations of "
                  f"{args.steps_per_iteration} steps on {args.num_devices} device(s); compiled "
                  f"in {self.compile_seconds:.1f}s; logging to {self.run_dir}{resumed}")
        return self

    # ---- the training loop ------------------------------------------------------------------
    def update_step(self, state):
        """Queues one iteration on the device and returns at once: (the new state, its metrics),
        arrays the device is still computing. The compiled step takes over `state` (donated: its
        arrays are gone after the call); a copy of its parameters is kept first, for a non-finite
        stop to save."""
        self.params_before = copy_tree(self.agent.params(state))
        return self.compiled_step(state)

    def iterations(self):
        """The iterations left, from the one after the start; none more once a signal came or an
        iteration was found non-finite, and none with --load-model."""
        if self.args.load_model:
            return
        self.train_start = time.time() - self.elapsed  # a resumed clock goes on from its checkpoint
        for iteration in range(self.start.iteration + 1, self.args.num_iterations + 1):
            yield iteration
            if self.status == "non_finite":
                return
            if self.stop.received:
                self.status = "interrupted"
                return
        self.status = "completed"

    def log_iteration(self, iteration: int, metrics: dict, scalars: Callable[[dict], dict],
                      first_non_finite: Callable[[dict], str] | None = None) -> None:
        """Takes iteration `iteration`'s metrics (the device's arrays, from `update_step`) and logs
        the iteration before it if still pending (on a GPU or TPU; a CPU's `end_iteration` read it
        already), whose metrics are ready by now: charts/SPS and the episodes that ended in it
        (never placeholders), the script's own `scalars(metrics)` ({tag: value}; what is not
        finite stays out), and `metrics["histograms"]`, if there, on the first iteration and
        every tenth. Where that iteration's `metrics["finite"]` is False, training stops
        there: `first_non_finite(metrics)` names what went non-finite, and this iteration is
        dropped.
        The earlier form (metrics read by the script, a dict of scalars, no first_non_finite, and
        `stop_non_finite` called by the loop) is refused with one line (CHANGELOG.md)."""
        if not callable(scalars) or not callable(first_non_finite):
            cli.fail(EARLIER_LOG_ITERATION)
        done, self.pending = self.pending, Pending(iteration, metrics, scalars, first_non_finite,
                                                   self.params_before)
        if done is not None:
            self.read_iteration(done)

    def end_iteration(self, iteration: int, state) -> None:
        """After `log_iteration(iteration, ...)`, with the state the iteration left: a copy of it
        kept for the checkpoint every --checkpoint-every iterations, and of its parameters for the
        evaluation every --eval-every, each used once the iteration is known to be finite."""
        pending = self.pending
        if pending is None or pending.iteration != iteration:  # dropped: training stopped
            return
        if self.checkpoints and iteration % self.args.checkpoint_every == 0:
            self.pending = pending._replace(state=copy_tree(state))
        if self.evaluates_after(iteration):
            self.pending = self.pending._replace(params=copy_tree(self.agent.params(state)))
        if not self.late:
            self.read_pending()

    def read_pending(self) -> None:
        """Reads the iteration still pending, if any: after the loop, or where a caller times
        whole blocks of iterations."""
        done, self.pending = self.pending, None
        if done is not None:
            self.read_iteration(done)

    def read_iteration(self, done: Pending) -> None:
        """The host's share of iteration `done`: its metrics read and logged, and, if it is
        finite, the progress line every tenth of the run, its checkpoint and its evaluation."""
        metrics = jax.device_get(done.metrics)
        iteration = done.iteration
        self.log_metrics(iteration, metrics, done.scalars(metrics), metrics.get("histograms"))
        if not metrics["finite"]:  # stop; the parameters from before it are saved
            self.status, self.non_finite = "non_finite", (iteration, done.first_non_finite(metrics))
            self.params, self.pending = done.params_before, None
            return
        self.iteration = iteration
        global_step = iteration * self.args.steps_per_iteration
        if self.tenth(iteration):
            print(f"step {global_step:>9,} | SPS {global_step / self.elapsed:>8,.0f} | "
                  f"episodic return {self.recent_return:6.2f}")
        if done.state is not None:
            self.checkpoints.save(done.state, Progress(iteration, self.history, self.elapsed),
                                  global_step)
        if done.params is not None:
            self.evaluate_every(iteration, done.params)

    def log_metrics(self, iteration: int, metrics: dict, scalars: dict,
                    histograms: dict | None) -> None:
        global_step = iteration * self.args.steps_per_iteration
        self.elapsed = time.time() - self.train_start
        logged = {"charts/SPS": global_step / self.elapsed}
        if metrics["episodes"] > 0:
            self.recent_return = metrics["episode_return_sum"] / metrics["episodes"]
            logged["charts/episodic_return"] = self.recent_return
            logged["charts/episodic_length"] = (metrics["episode_length_sum"]
                                                / metrics["episodes"])
            self.history.steps.append(global_step)
            self.history.seconds.append(self.elapsed)
            self.history.returns.append(float(self.recent_return))
        logged |= scalars
        logger.log_scalars(self.log, {tag: v for tag, v in logged.items() if np.isfinite(v)},
                           global_step)
        if histograms is not None and (self.tenth(iteration) or iteration == 1):
            logger.log_histograms(self.log, histograms, global_step)

    def tenth(self, iteration: int) -> bool:
        return iteration % self.every_tenth == 0 or iteration == self.args.num_iterations

    def evaluates_after(self, iteration: int) -> bool:
        """With --eval-every N: after every N-th iteration but the last (the final evaluation's)."""
        every = self.args.eval_every
        return bool(every) and iteration % every == 0 and iteration != self.args.num_iterations

    def evaluate_every(self, iteration: int, params) -> None:
        """With --eval-every: the policy of `params` (the iteration's) played as at the end, each
        mean return logged at its step under the final evaluation's tag, so that TensorBoard draws
        the scores as training goes. The clock behind SPS and train_seconds stops while it
        plays."""
        started = time.time()
        played = {policy: self.play(params, policy).returns
                  for policy in evaluation.EVALUATION_PAIRS}
        returns = jax.device_get(played)  # only the returns come over, not the recorded frames
        step, shown = iteration * self.args.steps_per_iteration, []
        for policy, pair in evaluation.EVALUATION_PAIRS.items():
            means = [float(returns[policy][k].mean()) for k in range(len(pair))]
            for i, mean in zip(pair, means):
                self.log.add_scalar(evaluation.return_tag(*evaluation.EVALUATIONS[i]), mean, step)
            shown.append(f"{policy} {' / '.join(f'{mean:.2f}' for mean in means)}")
        print(f"step {step:>9,} | eval return, gymnax's / MinAtar's protocol: {', '.join(shown)}")
        self.train_start += time.time() - started

    def finish(self, state) -> None:
        """After the loop: the last iteration read (its checkpoint left to this one), the last
        checkpoint, of `state`, and summary.json's training fields. After a non-finite stop
        `state` is not finite: the checkpoint stays the last one written before it. Nothing with
        --load-model."""
        if self.args.load_model:
            return
        if self.pending is not None:  # the checkpoint of `state` follows
            self.pending = self.pending._replace(state=None)
        self.read_pending()
        iterations = self.iteration
        step = iterations * self.args.steps_per_iteration
        if self.checkpoints and self.status != "non_finite":
            self.checkpoints.save(state, Progress(iterations, self.history, self.elapsed), step)
        fields = {"status": self.status, "global_step": step, "iterations": iterations,
                  "train_seconds": self.elapsed, "sps": step / self.elapsed if step else 0.0}
        if self.args.resume:
            fields["resumed_at_step"] = self.start.iteration * self.args.steps_per_iteration
        if self.status == "non_finite":
            iteration, what = self.non_finite
            kept = ("saved the parameters from before it" if self.args.save_model
                    else "saved nothing (--no-save-model)")
            print(f"error: {what} is non-finite in iteration {iteration}; stopped and {kept} "
                  f"(step {step:,})", file=sys.stderr)
            fields.update(non_finite=what, non_finite_iteration=iteration)
        elif self.status == "interrupted":
            print(f"interrupted at step {step:,}", file=sys.stderr)
        self.summary.update(fields)

    # ---- after training ---------------------------------------------------------------------
    @property
    def completed(self) -> bool:
        return self.summary["status"] == "completed"

    def parameters(self, state):
        """The parameters of `state`; --load-model's where it is None, and after a non-finite stop
        those from before it."""
        if state is None or self.status == "non_finite":
            return self.params
        return self.agent.params(state)

    def evaluate(self, state) -> None:
        """Once training completed: the final evaluations of `state`'s policy, drawn with the
        learning curve into the run directory and the log; summary.json's `eval`."""
        if not self.completed:
            return
        eval_start = time.time()
        # glibc keeps what training's host copies freed (its mmap threshold rises with each
        # large block freed): handed back here, the evaluation's peak does not sit on top of it
        startup.release_freed_memory()
        step = self.summary["global_step"]
        self.summary["eval"] = visualize.evaluate_and_draw(
            self.play, self.parameters(state), self.history, self.log, self.run_dir, step,
            f"{self.args.env_id}, seed {self.args.seed}", self.args.env_id, self.headline)
        self.summary.update(eval_episodes=self.args.eval_episodes,
                            eval_seconds=time.time() - eval_start)

    def save_model(self, state) -> None:
        """`state`'s parameters as the run's model.safetensors, with the arguments that rebuild the
        network (--save-model; not with --load-model)."""
        if not self.args.save_model or self.args.load_model:
            return
        self.summary["model"] = model.save_run_model(
            self.run_dir, os.path.splitext(os.path.basename(self.script))[0], self.args,
            self.parameters(state), self.network_args, self.summary["global_step"])

    def __exit__(self, *exc_info) -> None:
        try:
            self.stop.__exit__()
            if self.stop.received:
                self.summary["status"] = "interrupted"
            if self.checkpoints:
                self.checkpoints.close()
        finally:
            try:
                self.log.close()
            finally:
                self.summary.__exit__(*exc_info)
        if exc_info[0] is None:
            print(f"summary: {os.path.join(self.run_dir, 'summary.json')}")

    @property
    def exit_code(self) -> int:
        if self.stop.received:
            return 128 + self.stop.received
        return 3 if self.summary["status"] == "non_finite" else 0
