"""Tests of tools/tune.py: bad input, a killed run resumed, seeds that do not depend on their
neighbours, the network its settings describe, the stability record, a baseline compared on this
run's seeds, and the harness run as a user runs it. Its statistics: test_tools_stats.py."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_breakout as ppo
import pqn_minatar as pqn
from helpers import Finished, run_main
from tools import stats, tune
from utils import checkpoint

TUNE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                    "tune.py")
TINY = ["--ppo.total-timesteps", "4096", "--ppo.num-envs", "16", "--ppo.num-steps", "128",
        "--ppo.num-minibatches", "4", "--ppo.update-epochs", "1", "--eval-episodes", "8"]


def run_harness(cwd, *flags):
    """`python tools/tune.py` on TINY and `flags` in `cwd`, as a user runs it. Like the runs
    in this process, it uses the script's default compilation cache: a setting compiled by one is
    loaded by the other."""
    return subprocess.run([sys.executable, TUNE, *TINY, *flags], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def run_in_process(cwd, *flags) -> Finished:
    """tune.main() in this process, as run_harness runs it (helpers.run_main): without a new
    process's imports, about 5 s a run."""
    return run_main(tune, cwd, *TINY, *flags, timeout=300)


def refusal(cwd, flags, monkeypatch, capsys) -> tuple[int, str, str]:
    """tune.py's main() on `flags` in this process, run in `cwd`, for input it must refuse before
    any training: (exit status, stdout, stderr). In-process, a case does not pay a new process's
    imports (about 5 s); one test below checks a refusal from the shell."""
    def no_training(*_, **__):
        raise AssertionError("tune.py went on to train instead of refusing")

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [TUNE, *TINY, *flags])
    monkeypatch.setattr(tune, "train_seeds", no_training)
    with pytest.raises(SystemExit) as exit_:
        tune.main()
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


@pytest.mark.parametrize("backend, cache_dir", [("cpu", "the-cache"), ("tpu", ""), ("gpu", "")])
def test_the_harness_uses_jaxs_compilation_cache_on_the_cpu_only(tmp_path, monkeypatch, backend,
                                                                 cache_dir):
    """On a TPU an evaluation program read back from the cache evaluated wrongly
    (tune.configure_jax): there the harness compiles its programs afresh."""
    given = []

    def stop(cache):  # startup.configure_jax, the last step before training
        given.append(cache)
        raise SystemExit(0)

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    monkeypatch.setattr(tune.startup, "configure_jax", stop)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [TUNE, *TINY, "--ppo.jax-cache-dir", "the-cache"])
    with pytest.raises(SystemExit):
        tune.main()
    assert given == [cache_dir]


@pytest.mark.parametrize("flags, message", [
    (["--num-seeds", "0"], "error: --num-seeds must be positive, got 0"),
    (["--ppo.update-epochs", "0"], "error: --update-epochs must be positive, got 0"),
    (["--num-devices", "3"], "error: --num-devices 3 is more than the 2 devices JAX has"),
    (["--baseline", "other_seeds.json"],
     "error: --baseline other_seeds.json has no result for seed 2"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, flags,
                                                            message):
    other_seeds = {"seeds": [1, 3], "eval_returns": [1.0, 2.0]}
    (tmp_path / "other_seeds.json").write_text(json.dumps(other_seeds))
    status, out, err = refusal(tmp_path, ["--out", "out.json", *flags], monkeypatch, capsys)
    assert status == 2
    assert err.strip().splitlines() == [message]
    assert out == ""
    assert sorted(os.listdir(tmp_path)) == ["other_seeds.json"]


def test_from_the_shell_bad_input_exits_2_with_one_line(tmp_path):
    result = run_harness(tmp_path, "--out", "out.json", "--num-seeds", "0")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: --num-seeds must be positive, got 0"]
    assert result.stdout == ""
    assert os.listdir(tmp_path) == []


# Three seeds on two devices (one padding seed), in four chunks, with --stability's record.
RESUMED = ["--num-seeds", "3", "--num-chunks", "4", "--ppo.total-timesteps", "8192", "--stability"]


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory) -> dict:
    """The result of a RESUMED run never interrupted, shared by the tests of resuming, of seeds
    trained beside others and of the stability record; the harness run from the shell repeats it
    from the compilation cache."""
    whole = run_in_process(tmp_path_factory.mktemp("whole"), *RESUMED)
    assert whole.returncode == 0, whole.stderr
    return json.loads(whole.stdout)


class Killed(Exception):
    """Stands for kill -9: the run stops where it is, and nothing after that point runs."""


def test_a_killed_harness_run_resumes_from_its_last_chunk_bit_for_bit(tmp_path, whole_run,
                                                                      monkeypatch):
    print_progress = tune.print_progress

    def killed_after_the_first_chunk(chunk, *args, **kwargs):
        print_progress(chunk, *args, **kwargs)
        if chunk == 0:  # the checkpoint of chunk 1 is on disk
            raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(tune, "print_progress", killed_after_the_first_chunk)
        with pytest.raises(Killed):
            run_in_process(tmp_path, *RESUMED, "--checkpoint-dir", "saved")
    checkpoint_file = tmp_path / "saved" / tune.CHECKPOINT
    saved = checkpoint_file.read_bytes()

    # Another setting in the same directory is refused, and the checkpoint is left as it was.
    other = run_in_process(tmp_path, *RESUMED, "--checkpoint-dir", "saved",
                           "--ppo.learning-rate", "0.001")
    assert other.returncode == 2 and other.stderr.strip().splitlines() == [
        f"error: saved/{tune.CHECKPOINT} is of a run with --ppo.learning-rate 0.005, not 0.001; "
        f"give another --checkpoint-dir or remove it"]
    assert checkpoint_file.read_bytes() == saved
    # So is the same command where the environment sets another precision (on a TPU, other
    # numbers than the chunks saved).
    with monkeypatch.context() as patch:
        patch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "high")
        elsewhere = run_in_process(tmp_path, *RESUMED, "--checkpoint-dir", "saved")
    assert elsewhere.returncode == 2 and elsewhere.stderr.strip().splitlines() == [
        f"error: saved/{tune.CHECKPOINT} was written at the scripts' own precision, and this "
        f"process runs with JAX_DEFAULT_MATMUL_PRECISION=high; give another --checkpoint-dir or "
        f"remove it"]
    assert checkpoint_file.read_bytes() == saved

    # The same command again resumes.
    resumed = run_in_process(tmp_path, *RESUMED, "--checkpoint-dir", "saved")
    assert resumed.returncode == 0, resumed.stderr
    assert "chunk  1/4" not in resumed.stderr and "chunk  4/4" in resumed.stderr
    again = json.loads(resumed.stdout)
    for key in ("seeds", "eval_returns", "curve", "summary", "pooled_curve", "changed_args",
                "stability"):
        assert again[key] == whole_run[key], key
    assert again["resumed_after_chunk"] == 1 and "resumed_after_chunk" not in whole_run
    # The checkpoints' writing is timed, as part of training's time; none without a directory.
    timing = again["timing"]
    assert 0 < timing["checkpoint_seconds"] < timing["train_seconds"]
    assert whole_run["timing"]["checkpoint_seconds"] == 0

    # Killed after its last chunk (in the evaluation): the same command trains nothing and
    # evaluates the trained seeds, as the run that was not stopped did.
    finished = run_in_process(tmp_path, *RESUMED, "--checkpoint-dir", "saved")
    assert finished.returncode == 0, finished.stderr
    assert "chunk " not in finished.stderr
    assert json.loads(finished.stdout)["eval_returns"] == whole_run["eval_returns"]
    assert json.loads(finished.stdout)["resumed_after_chunk"] == 4


def test_a_seed_trains_the_same_beside_any_seeds_on_any_number_of_devices(whole_run):
    # Seeds 1-3 on two devices (one padding seed; each device's two in a lax.map), with
    # --stability's record, against seed 1 alone on one device (no loop around it), without it,
    # its initial state made and its evaluation compiled in threads (an accelerator's way: while
    # training's program compiles, and while it trains). Seed 1's trained
    # policy scores apart from its initial one (0.375 against 0.25): an evaluation of the wrong
    # network shows.
    together = whole_run
    cfg = ppo.fill_runtime_fields(ppo.Args(
        total_timesteps=8192, num_envs=16, num_steps=128, num_minibatches=4, update_epochs=1))
    alone = tune.train_seeds(cfg, [1], eval_episodes=8, num_chunks=4, num_devices=1,
                             evaluation_beside_training=True)
    assert together["seeds"] == [1, 2, 3] and len(together["eval_returns"]) == 3
    assert alone.eval_returns.tolist() == together["eval_returns"][:1]
    assert alone.eval_returns_minatar.tolist() == together["eval_returns_minatar"][:1]
    assert alone.return_sums.tolist() == together["curve"]["return_sums"][:1]
    assert alone.episodes.tolist() == together["curve"]["episodes"][:1]
    # the seeds do differ
    assert together["curve"]["return_sums"][0] != together["curve"]["return_sums"][1]


def test_seeds_side_by_side_train_each_seed_as_beside_any_others(monkeypatch):
    # --vmap-seeds (an accelerator's default), two at a time: seeds 1-3 on two devices (device 0
    # takes 1 and 2, device 1 takes 3 and a padding seed) against seeds 3, 1, 2 on one device
    # (groups 3 1 and 2 2): each seed trains and plays the same, wherever it sits.
    cfg = ppo.fill_runtime_fields(ppo.Args(
        total_timesteps=8192, num_envs=16, num_steps=128, num_minibatches=4, update_epochs=1))
    in_order = tune.train_seeds(cfg, [1, 2, 3], eval_episodes=8, num_chunks=2, num_devices=2,
                                vmap_seeds=2)
    rotated = tune.train_seeds(cfg, [3, 1, 2], eval_episodes=8, num_chunks=2, num_devices=1,
                               vmap_seeds=2)
    assert in_order.vmap_seeds == rotated.vmap_seeds == 2
    assert rotated.eval_returns.tolist() == in_order.eval_returns[[2, 0, 1]].tolist()
    assert rotated.return_sums.tolist() == in_order.return_sums[[2, 0, 1]].tolist()
    assert len({tuple(sums) for sums in in_order.return_sums.tolist()}) == 3  # seeds do differ
    # On a CPU the seeds run one at a time unless told; on an accelerator, all of a device's.
    assert tune.seed_layout(5, 1) == (1, 1)
    monkeypatch.setattr(jax, "devices", lambda: [type("Tpu", (), {"platform": "tpu"})()] * 2)
    assert tune.seed_layout(5) == (2, 3) and tune.seed_layout(5, 1) == (1, 5)
    # Up to 16 on a device at once; more in the fewest equal groups of at most eight.
    assert tune.seed_layout(10, 1) == (1, 10) and tune.seed_layout(16, 1) == (1, 16)
    assert tune.seed_layout(32, 1) == (1, 8) and tune.seed_layout(17, 1) == (1, 6)
    assert tune.seed_layout(32) == (2, 16) and tune.seed_layout(64) == (2, 8)
    assert tune.seed_layout(32, 1, 32) == (1, 32)  # asked for: kept


def test_the_harness_builds_the_network_its_settings_describe(monkeypatch):
    class Built(Exception):
        pass

    def build(*args, **kwargs):  # the network the harness asks for, and no training after it
        raise Built(make_network(*args, **kwargs))

    make_network = ppo.make_network
    monkeypatch.setattr(ppo, "make_network", build)
    cfg = ppo.fill_runtime_fields(ppo.Args(
        total_timesteps=4096, num_envs=16, num_steps=128, hidden_sizes=(8,), activation="relu",
        layer_norm=False, conv_channels=2))
    with pytest.raises(Built) as built:
        tune.train_seeds(cfg, [1], eval_episodes=8, num_chunks=1, num_devices=1)
    params = built.value.args[0].init(jax.random.key(0), jnp.zeros((1, 10, 10, 4)))
    assert params["conv"]["w"].shape == (3, 3, 4, 2) and params["torso_0"]["w"].shape == (50, 8)
    # ReLU: 8 features
    assert "torso_norm_0" not in params and params["policy"]["w"].shape == (8, 3)


def test_stability_records_the_logit_gap_the_log_ratio_and_a_seed_gone_non_finite(tmp_path,
                                                                                   whole_run):
    # The defaults stay finite with a modest logit gap; Adam steps of 1e30 overflow every seed.
    stability = whole_run["stability"]
    assert stability["non_finite"] == [False, False, False]
    for seed in range(3):
        assert 0 < stability["logit_gap_max"][seed] < 50
        assert stability["log_ratio_min"][seed] < 0 < stability["log_ratio_max"][seed]
    exploding = run_in_process(tmp_path, "--num-seeds", "2", "--num-chunks", "2", "--stability",
                               "--quiet", "--ppo.learning-rate", "1e30", "--ppo.no-anneal-lr")
    assert exploding.returncode == 0, exploding.stderr
    assert json.loads(exploding.stdout)["stability"]["non_finite"] == [True, True]


def test_a_baseline_is_compared_on_this_runs_seeds_only():
    result = tune.SeedsResult(eval_returns=np.array([30.0, 40.0]),
                              eval_returns_minatar=np.array([5.0, 6.0]),
                              minatar_bound_hits=np.zeros(2, int), return_sums=np.ones((2, 1)),
                              episodes=np.ones((2, 1), int), chunk_steps=[100], compile_seconds=0.0,
                              train_seconds=0.0, eval_seconds=0.0)
    baseline = {"seeds": [1, 2, 3, 4], "eval_returns": [10.0, 25.0, 35.0, 99.0],
                "changed_args": {}, "command": "c"}
    out = tune.result_json(ppo.Args(), [2, 3], result, 8, "command", 1.0, baseline)
    assert out["comparison"]["mean_difference"]["value"] == pytest.approx((30 + 40 - 25 - 35) / 2)


def test_harness_writes_its_statistics_and_compares_with_a_baseline(tmp_path, whole_run):
    # whole_run's setting: its programs come from the compilation cache.
    first = run_harness(tmp_path, *RESUMED, "--out", "a.json")
    assert first.returncode == 0, first.stderr
    result = json.loads((tmp_path / "a.json").read_text())
    assert json.loads(first.stdout) == result
    assert "chunk  1/4" in first.stderr and "chunk  4/4" in first.stderr  # progress, chunk by chunk

    returns = np.array(result["eval_returns"])
    assert result["seeds"] == [1, 2, 3] and returns.shape == (3,)
    # Both protocols, gymnax's in eval_returns whatever the training used, MinAtar's beside it.
    assert len(result["eval_returns_minatar"]) == 3 and result["minatar_bound_hits"] == [0, 0, 0]
    assert (result["summary_minatar"]["mean"]["value"]
            == pytest.approx(np.mean(result["eval_returns_minatar"])))
    assert result["changed_args"] == {"total_timesteps": 8192, "num_envs": 16, "num_minibatches": 4,
                                      "update_epochs": 1}
    assert result["curve"]["steps"] == [2048, 4096, 6144, 8192]
    assert (np.array(result["curve"]["return_sums"]).shape
            == np.array(result["curve"]["episodes"]).shape == (3, 4))
    summary = result["summary"]
    assert summary["mean"]["value"] == pytest.approx(returns.mean())
    assert summary["iqm"]["value"] == pytest.approx(stats.iqm(returns))
    for name in ("mean", "iqm"):
        low, high = summary[name]["ci"]
        assert low <= summary[name]["value"] <= high
    assert summary["share_past_wall"]["count"] == int((returns >= 30).sum())
    assert len(result["pooled_curve"]["return"]) == 4
    assert result["timing"]["peak_memory_gb"] > 0 and "CPU family" in result["timing"]["machine"]
    assert "env_vars" not in result  # the scripts' own precision: nothing to set
    # The code that ran, as the digest of the harness and the script the checkpoints hold.
    assert result["code"] == checkpoint.code_version(tune.__file__, ppo.__file__)
    # Where the set-up went, program by program, as its lines said while it ran.
    parts = result["timing"]["compile_parts"]
    assert list(parts) == ["init", "train", "evaluate"]
    assert sum(parts.values()) == pytest.approx(result["timing"]["compile_seconds"], abs=0.01)
    assert "compiled evaluate in" in first.stderr.split("chunk  1/4")[0]

    # The same setting on the same seeds again, against the first run: identical returns, so the
    # differences are 0 and a run of either is as likely to be the better one. With the
    # environment naming another precision, its record names it (this process's JAX took its
    # precision at import, so here only the record changes).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "high")
        second = run_in_process(tmp_path, *RESUMED, "--baseline", "a.json", "--quiet")

    assert second.returncode == 0, second.stderr
    assert second.stderr == ""  # --quiet
    again = json.loads(second.stdout)
    assert again["eval_returns"] == result["eval_returns"]
    assert again["env_vars"] == "JAX_DEFAULT_MATMUL_PRECISION=high"
    comparison = again["comparison"]
    assert comparison["iqm_difference"] == {"value": 0.0, "ci": [0.0, 0.0]}
    assert comparison["probability_of_improvement"]["value"] == 0.5


# ---- PQN: --script pqn_minatar ----

# The setting of the defaults trial of test_tools_search.py's tiny PQN study: the compilation
# cache holds its programs once either has run.
PQN_TINY = ["--script", "pqn_minatar", "--pqn.total-timesteps", "8192", "--pqn.num-envs", "16",
            "--eval-episodes", "4", "--num-chunks", "2"]


def pqn_tiny_args() -> pqn.Args:
    """PQN_TINY's settings, as train_seeds takes them."""
    return pqn.fill_runtime_fields(pqn.Args(
        total_timesteps=8192, num_envs=16))


@pytest.fixture(scope="module")
def pqn_run(tmp_path_factory):
    """The harness's main() on tiny PQN for seeds 1 and 2, in this process: (what it printed, the
    JSON it wrote), for the PQN tests below."""
    path = tmp_path_factory.mktemp("pqn")
    finished = run_main(tune, path, *PQN_TINY, "--num-seeds", "2", "--out", "pqn.json")
    assert finished.returncode == 0, finished.stderr
    return finished, json.loads((path / "pqn.json").read_text())


def test_the_harness_trains_pqn_for_two_seeds_and_says_so(pqn_run):
    finished, result = pqn_run
    assert json.loads(finished.stdout) == result
    assert "chunk  1/2" in finished.stderr and "chunk  2/2" in finished.stderr
    assert (result["script"], result["policy"]) == ("pqn_minatar", "greedy")
    assert result["args"]["q_lambda"] == 0.65
    assert result["changed_args"] == {"total_timesteps": 8192, "num_envs": 16}
    assert result["seeds"] == [1, 2] and result["curve"]["steps"] == [4096, 8192]
    # Breakout's returns count bricks: whole, finite, not negative; every seed ends episodes.
    returns = np.array(result["eval_returns"] + result["eval_returns_minatar"])
    assert returns.shape == (4,) and np.isfinite(returns).all() and (returns >= 0).all()
    assert (np.array(result["curve"]["episodes"]) > 0).all()
    assert (np.array(result["curve"]["return_sums"]) >= 0).all()


def test_the_harness_scores_pqn_by_the_argmax_of_its_q_values(monkeypatch):
    # The harness plays the script's headline policy: PQN's own test protocol, argmax Q.
    played = []
    evaluate_each = tune.evaluate_each
    monkeypatch.setattr(tune, "evaluate_each",
                        lambda *a, **k: played.append(a[2].tolist()) or evaluate_each(*a, **k))
    tune.train_seeds(pqn_tiny_args(), [1], eval_episodes=4, num_chunks=1, num_devices=1)
    assert pqn.HEADLINE_POLICY == "greedy" and played == [[True, True]]  # both protocols


def test_a_pqn_seed_trains_the_same_beside_another_seed_as_alone(pqn_run):
    _, together = pqn_run  # seeds 1 and 2, one on each device
    alone = tune.train_seeds(pqn_tiny_args(), [2], eval_episodes=4, num_chunks=2, num_devices=1)
    assert alone.eval_returns.tolist() == together["eval_returns"][1:]
    assert alone.return_sums.tolist() == together["curve"]["return_sums"][1:]
    assert alone.episodes.tolist() == together["curve"]["episodes"][1:]
    # the seeds do differ
    assert together["curve"]["return_sums"][0] != together["curve"]["return_sums"][1]


def test_a_stopped_pqn_run_resumes_from_its_checkpoint_bit_for_bit(pqn_run, tmp_path):
    _, whole = pqn_run
    path = str(tmp_path / tune.CHECKPOINT)

    class Stopped(Exception):
        pass

    def stop(*_):  # after the first chunk's checkpoint is written, as a pruned trial stops
        raise Stopped()

    with pytest.raises(Stopped):
        tune.train_seeds(pqn_tiny_args(), [1, 2], 4, 2, on_chunk=stop, checkpoint_path=path)
    chunks = []
    resumed = tune.train_seeds(pqn_tiny_args(), [1, 2], 4, 2, checkpoint_path=path,
                               on_chunk=lambda chunk, *_: chunks.append(chunk))
    assert chunks == [1]  # the first chunk came from the checkpoint
    assert resumed.eval_returns.tolist() == whole["eval_returns"]
    assert resumed.return_sums.tolist() == whole["curve"]["return_sums"]
    assert resumed.episodes.tolist() == whole["curve"]["episodes"]


@pytest.mark.parametrize("flags, message", [
    (["--script", "pqn_minatar", "--ppo.gae-lambda", "0.8"],
     "error: --ppo.gae-lambda: the settings of --script pqn_minatar are --pqn.* flags"),
    (["--pqn.q-lambda", "0.8"],
     "error: --pqn.q-lambda: the settings of --script ppo_breakout are --ppo.* flags"),
    (["--script", "no_such_script"], "error: --script no_such_script: no such script"),
    (["--script", "pqn_minatar", "--baseline", "ppo.json"],
     "error: --baseline ppo.json is a result of another script, not pqn_minatar"),
])
def test_the_harness_refuses_what_the_script_under_test_cannot_use(tmp_path, monkeypatch, flags,
                                                                   message):
    def no_training(*_, **__):
        raise AssertionError("the harness went on to train instead of refusing")

    monkeypatch.setattr(tune, "train_seeds", no_training)
    # A result without "script" was written before the harness trained PQN: a PPO result.
    ppo_result = {"seeds": list(range(1, 9)), "eval_returns": [1.0] * 8}
    (tmp_path / "ppo.json").write_text(json.dumps(ppo_result))
    result = run_main(tune, tmp_path, *flags, "--out", "out.json")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert result.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["ppo.json"]


def test_both_policies_adds_the_other_policy_as_the_harness_would_report_it(monkeypatch):
    import tiny_pg
    from utils import contract, training

    cfg = contract.fill_runtime_fields(tiny_pg, training.parse_args(
        tiny_pg, ["--total-timesteps", "4096", "--num-envs", "16"]))
    run = functools.partial(tune.train_seeds, cfg, [1, 2], eval_episodes=8, num_chunks=1,
                            num_devices=1)
    both, headline = run(both_policies=True), run()
    # The headline policy (tiny_pg's sampled actions) is what it was without the flag ...
    for name in ("eval_returns", "eval_returns_minatar", "minatar_bound_hits"):
        np.testing.assert_array_equal(getattr(both, name), getattr(headline, name))
    assert headline.other_returns is None
    # ... and the other is what the harness reports where that one is the headline.
    monkeypatch.setattr(tiny_pg, "HEADLINE_POLICY", "greedy")
    greedy = run()
    np.testing.assert_array_equal(both.other_returns, greedy.eval_returns)
    np.testing.assert_array_equal(both.other_returns_minatar, greedy.eval_returns_minatar)
    np.testing.assert_array_equal(both.other_bound_hits, greedy.minatar_bound_hits)
    assert not np.array_equal(both.other_returns, both.eval_returns)
    monkeypatch.undo()
    out = tune.result_json(cfg, [1, 2], both, 8, "python tools/tune.py", 1.0)
    assert out["policy"] == "sampled" and out["other_policy"]["policy"] == "greedy"
    assert out["other_policy"]["eval_returns"] == greedy.eval_returns.tolist()
    assert "other_policy" not in tune.result_json(cfg, [1, 2], headline, 8, "python", 1.0)
