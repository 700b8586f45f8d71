"""The bookkeeping around a script's training loop, for any algorithm: the run directory, its
TensorBoard log, the learning curve and clock, checkpoints and resume, Ctrl-C, and summary.json.

A script's Args carry the fields this reads: exp_name, seed, env_id, total_timesteps,
num_iterations, batch_size (environment steps per iteration), checkpoint_every, eval_every, resume,
load_model. Its update returns metrics with `episodes`, `episode_return_sum` and
`episode_length_sum` of the episodes that ended in the iteration."""

import os
import sys
import time

import jax
import numpy as np

from utils import cli, evaluation, logger, model, visualize
from utils.checkpoint import Checkpointer, Progress, fresh_start, read_checkpoint_args

# They change no result.
RESUME_MAY_CHANGE = ("checkpoint_every", "eval_every", "jax_cache_dir", "num_devices")


def take_saved_args(script: str, args, given: set[str], network_args: tuple[str, ...],
                    before: dict) -> str | None:
    """--load-model takes the network's arguments (`network_args`) from the model file's header,
    --resume all the run's arguments from its checkpoint; a flag given explicitly must agree.
    `before`: the values of arguments added since files were first saved. An error, or None."""
    try:
        if args.resume and args.load_model:
            return "--resume continues training and --load-model only evaluates: give one of them"
        if args.load_model:
            saved = model.read_network_args(args.load_model, network_args, before)
            return cli.adopt(args, saved, given, f"{args.load_model} was trained")
        if args.resume:
            saved = read_checkpoint_args(script, args.resume)
            return cli.adopt(args, saved, given, f"{args.resume} was run", RESUME_MAY_CHANGE)
    except ValueError as e:
        return str(e)
    return None


class Run:
    """A run of `script`: `with Run(...) as run:` opens its directory (new, or --resume's), log,
    summary.json and signal handlers; in the loop, `log_iteration` and `end_iteration` keep the
    books of each iteration, and `finish` those of training; on leaving, summary.json is written
    however the run ended, and `exit_code` says how."""

    def __init__(self, script: str, args, start: Progress | None, compile_seconds: float,
                 wall_start: float):
        self.script, self.args, self.compile_seconds = script, args, compile_seconds
        self.start = start or fresh_start()
        self.history, self.elapsed = self.start.history, self.start.train_seconds
        self.iteration = self.start.iteration  # the last finite iteration
        self.recent_return = self.history.returns[-1] if self.history.returns else float("nan")
        self.every_tenth = max(1, args.num_iterations // 10)
        self.run_dir = args.resume or cli.make_run_dir(
            f"{args.env_id}__{args.exp_name}__{args.seed}")
        self.summary = cli.RunSummary(self.run_dir, args, wall_start, env_id=args.env_id,
                                      seed=args.seed, total_timesteps=args.total_timesteps,
                                      compile_seconds=compile_seconds)
        self.status = None

    def __enter__(self) -> "Run":
        start_step = self.start.iteration * self.args.batch_size
        self.log = logger.RunLog(self.run_dir, start_step,
                                 start_step + 1 if self.args.resume else None)
        if not self.args.resume:
            self.log.add_text("hyperparameters", logger.hyperparameters_text(self.args))
        self.checkpoints = None
        if self.args.checkpoint_every and not self.args.load_model:
            self.checkpoints = Checkpointer(self.script, self.run_dir, self.args, self.log)
        self.summary.__enter__()
        self.stop = cli.StopSignals().__enter__()
        if self.args.load_model:
            print(f"{self.args.env_id}: evaluating {self.args.load_model}; compiled in "
                  f"{self.compile_seconds:.1f}s; logging to {self.run_dir}")
            self.summary.update(status="completed", global_step=0,
                                load_model=self.args.load_model)
        else:
            resumed = f"; resumed at step {start_step:,}" if self.args.resume else ""
            print(f"{self.args.env_id}: {self.args.num_iterations} iterations of "
                  f"{self.args.batch_size} steps on {self.args.num_devices} device(s); compiled "
                  f"in {self.compile_seconds:.1f}s; logging to {self.run_dir}{resumed}")
        return self

    # ---- the training loop ------------------------------------------------------------------
    def iterations(self):
        """The iterations left, from the one after the start; none more once a signal came."""
        self.train_start = time.time() - self.elapsed  # a resumed clock goes on from its checkpoint
        for iteration in range(self.start.iteration + 1, self.args.num_iterations + 1):
            yield iteration
            if self.stop.received:
                self.status = "interrupted"
                return
        self.status = "completed"

    def log_iteration(self, iteration: int, metrics: dict, scalars: dict,
                      histograms: dict | None = None) -> None:
        """Logs an iteration: charts/SPS and the episodes that ended in it (never placeholders),
        the script's own `scalars` ({tag: value}; what is not finite stays out, the script's guard
        reports it), and `histograms` on the first iteration and every tenth of the run."""
        global_step = iteration * self.args.batch_size
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

    def end_iteration(self, iteration: int, state) -> None:
        """After a finite iteration: the progress line every tenth of the run, and a checkpoint
        of `state` every --checkpoint-every iterations."""
        self.iteration, global_step = iteration, iteration * self.args.batch_size
        if self.tenth(iteration):
            print(f"step {global_step:>9,} | SPS {global_step / self.elapsed:>8,.0f} | "
                  f"episodic return {self.recent_return:6.2f}")
        if self.checkpoints and iteration % self.args.checkpoint_every == 0:
            self.checkpoints.save(state, Progress(iteration, self.history, self.elapsed),
                                  global_step)

    def evaluate_every(self, iteration: int, play, params) -> None:
        """With --eval-every N, after every N-th iteration but the last (the final evaluation's):
        `params` played as at the end (`play`: evaluation.compile_final_evaluation's), each mean
        return logged at its step under the final evaluation's tag, so that TensorBoard draws the
        scores as training goes. The clock behind SPS and train_seconds stops while it plays."""
        every = self.args.eval_every
        if not every or iteration % every or iteration == self.args.num_iterations:
            return
        started = time.time()
        played = {policy: play(params, policy).returns for policy in evaluation.EVALUATION_PAIRS}
        returns = jax.device_get(played)  # only the returns come over, not the recorded frames
        step, shown = iteration * self.args.batch_size, []
        for policy, pair in evaluation.EVALUATION_PAIRS.items():
            means = [float(returns[policy][k].mean()) for k in range(len(pair))]
            for i, mean in zip(pair, means):
                self.log.add_scalar(evaluation.return_tag(*evaluation.EVALUATIONS[i]), mean, step)
            shown.append(f"{policy} {' / '.join(f'{mean:.2f}' for mean in means)}")
        print(f"step {step:>9,} | eval return, gymnax's / MinAtar's protocol: {', '.join(shown)}")
        self.train_start += time.time() - started

    def stop_non_finite(self, iteration: int, what: str) -> None:
        """Ends training at `iteration`, in which `what` went non-finite."""
        self.status, self.non_finite = "non_finite", (iteration, what)

    def finish(self, state) -> None:
        """After the loop: the last checkpoint, of `state` (after a non-finite value, the last
        finite one), and summary.json's training fields."""
        iterations = self.iteration
        step = iterations * self.args.batch_size
        if self.checkpoints:
            self.checkpoints.save(state, Progress(iterations, self.history, self.elapsed), step)
        fields = {"status": self.status, "global_step": step, "iterations": iterations,
                  "train_seconds": self.elapsed, "sps": step / self.elapsed if step else 0.0}
        if self.args.resume:
            fields["resumed_at_step"] = self.start.iteration * self.args.batch_size
        if self.status == "non_finite":
            iteration, what = self.non_finite
            print(f"error: {what} is non-finite in iteration {iteration}; stopped and saved the "
                  f"parameters from before it (step {step:,})", file=sys.stderr)
            fields.update(non_finite=what, non_finite_iteration=iteration)
        elif self.status == "interrupted":
            print(f"interrupted at step {step:,}", file=sys.stderr)
        self.summary.update(fields)

    # ---- after training ---------------------------------------------------------------------
    @property
    def completed(self) -> bool:
        return self.summary["status"] == "completed"

    def evaluate(self, play, params) -> None:
        """Plays the final evaluations (`play`: evaluation.compile_final_evaluation's) and draws
        them and the learning curve into the run directory and the log; summary.json's `eval`."""
        eval_start = time.time()
        step = self.summary["global_step"]
        self.summary["eval"] = visualize.evaluate_and_draw(
            play, params, self.history, self.log, self.run_dir, step,
            f"{self.args.env_id}, seed {self.args.seed}", self.args.env_id)
        self.summary.update(eval_episodes=self.args.eval_episodes,
                            eval_seconds=time.time() - eval_start)

    def save_model(self, params, network_args: tuple[str, ...]) -> None:
        """The final parameters as the run's model.safetensors, with the arguments that rebuild
        the network."""
        self.summary["model"] = model.save_run_model(self.run_dir, self.args, params, network_args,
                                                     self.summary["global_step"])

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
