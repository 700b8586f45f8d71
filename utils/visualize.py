"""Pictures of a trained agent: its play as a GIF, its behaviour at evaluation, its learning curve;
and the reports that print them, log them to TensorBoard and write them into the run directory.

Everything here reads results on the host (numpy arrays from `utils.evaluation.evaluate` and logged
returns) and writes files; nothing runs under `jit`. MinAtar observations are 10x10 grids with one
binary channel per kind of object, drawn here one colour per channel.
"""

import concurrent.futures
import io

import jax
import matplotlib

matplotlib.use("Agg")  # write files, never open a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import GifImagePlugin, Image, ImageDraw  # noqa: E402

from utils import evaluation, logger  # noqa: E402
from utils.evaluation import EVALUATION_PAIRS, EVALUATIONS  # noqa: E402

# Each MinAtar game's observation channels, in gymnax's order, with MinAtar's names.
GAME_CHANNELS = {
    "Asterix-MinAtar": ["player", "enemy", "trail", "gold"],
    "Breakout-MinAtar": ["paddle", "ball", "trail", "brick"],
    "Freeway-MinAtar": ["chicken", "car", "speed 1", "speed 2", "speed 3", "speed 4", "speed 5"],
    "SpaceInvaders-MinAtar": ["cannon", "alien", "alien left", "alien right", "friendly bullet",
                              "enemy bullet"],
    "Seaquest-MinAtar": ["sub front", "sub back", "friendly bullet", "trail", "enemy bullet",
                         "enemy fish", "enemy sub", "oxygen gauge", "diver gauge", "diver"],
}
BREAKOUT_PADDLE, BREAKOUT_BALL, BREAKOUT_BRICK = 0, 1, 3
CHANNEL_COLOURS = (np.array(plt.get_cmap("tab10").colors) * 255).astype(np.uint8)
CELL = 16  # pixels per grid cell
# The GIF's 16 colours (4 bits a pixel): 0 empty, 1-10 the channels, 11 grid lines, 12 text,
# 15 "unchanged".
PALETTE = np.zeros((16, 3), np.uint8)
PALETTE[1:11], PALETTE[11], PALETTE[12] = CHANNEL_COLOURS, (40, 40, 40), (255, 255, 255)
TRANSPARENT = 15
LABEL = 14  # pixels of the label strip above each panel


# --------------------------------------------------------------------------------------------------
# The agent playing
# --------------------------------------------------------------------------------------------------
def grids_to_pixels(obs: np.ndarray) -> np.ndarray:
    """(T, H, W, C) binary grids -> (T, H * CELL, W * CELL) palette indices: 0 is empty, c + 1 is
    channel c (a later channel drawn over an earlier one), with a dark line between cells."""
    indices = np.zeros(obs.shape[:3], np.uint8)
    for channel in range(obs.shape[-1]):
        indices = np.where(obs[..., channel] > 0, channel + 1, indices)
    pixels = indices.repeat(CELL, axis=1).repeat(CELL, axis=2)
    pixels[:, ::CELL, :] = pixels[:, :, ::CELL] = 11  # grid lines
    return pixels


def text_strip(width: int, texts: list[tuple[int, str, int]]) -> np.ndarray:
    """A LABEL-high strip of palette indices with each (x, text, colour index) written on it."""
    strip = Image.new("P", (width, LABEL))
    for x, text, colour in texts:
        ImageDraw.Draw(strip).text((x, 1), text, fill=colour)
    return np.asarray(strip)


def play_gif(episodes: list[np.ndarray], titles: list[str], channel_names: list[str] | None = None,
             frame_ms: int = 50, ends: list[str] | None = None) -> bytes:
    """A GIF of several episodes side by side, one panel each, frame t showing every episode's
    step t (an episode that has ended stays on its last frame). Each episode is (T, H, W, C); a
    legend of the channels' colours runs along the bottom."""
    num_frames = max(len(episode) for episode in episodes)
    height, width = episodes[0].shape[1] * CELL, episodes[0].shape[2] * CELL
    gap = 4
    total_width = len(episodes) * (width + gap) - gap
    names = channel_names or [f"channel {c}" for c in range(episodes[0].shape[-1])]
    rows, x = [[]], 2  # the legend's entries, (x, channel), wrapped into rows that fit the width
    measure = ImageDraw.Draw(Image.new("P", (1, 1)))
    for channel, name in enumerate(names):
        entry = 11 + int(measure.textlength(name)) + 10  # swatch, name, space
        if x + entry > total_width and rows[-1]:
            rows, x = rows + [[]], 2
        rows[-1].append((x, channel))
        x += entry
    legend = len(rows) * LABEL
    # What every frame shares: the legend, and the gaps between panels.
    background = np.zeros((LABEL + height + legend, total_width), np.uint8)
    for r, row in enumerate(rows):
        top = LABEL + height + r * LABEL
        background[top:top + LABEL] = text_strip(total_width,
                                                 [(x + 11, names[c], 12) for x, c in row])
        for x, channel in row:  # a colour swatch before each name
            background[top + 3:top + 11, x:x + 8] = channel + 1
    # Each panel's label while its episode plays, and from its last frame on.
    labels = [(text_strip(width, [(2, title, 12)]), text_strip(
        width, [(2, f"{title}: {ends[i] if ends else f'over at {len(episode) - 1}'}", 12)]))
        for i, (episode, title) in enumerate(zip(episodes, titles))]

    def frame(t: int) -> np.ndarray:
        """Frame t: every episode's step t (an episode that has ended stays on its last frame)."""
        pixels = background.copy()
        for i, episode in enumerate(episodes):
            left = i * (width + gap)
            pixels[LABEL:LABEL + height, left:left + width] = grids_to_pixels(
                episode[min(t, len(episode) - 1)][None])[0]
            pixels[:LABEL, left:left + width] = labels[i][t >= len(episode) - 1]
        return pixels

    palette = PALETTE.ravel().tolist()

    def image(pixels: np.ndarray) -> Image.Image:
        picture = Image.fromarray(pixels, "P")
        picture.putpalette(palette)
        return picture

    # Written frame by frame from Pillow's GIF pieces (getheader, getdata): Image.save(save_all=1)
    # keeps every frame until the end, up to 1001 of them (80-300 MB measured at the peak). Each
    # frame after the first is cut to the box of pixels that changed, the others in it transparent:
    # each frame stores only the ball's and paddle's moves, drawn over the last (disposal 1).
    frame_info = {"duration": frame_ms, "transparency": TRANSPARENT, "disposal": 1}
    previous = frame(0)
    first = image(previous)
    header, _ = GifImagePlugin.getheader(first, info={"loop": 0, **frame_info})
    chunks = [*header, *GifImagePlugin.getdata(first, **frame_info)]
    for t in range(1, num_frames):
        pixels = frame(t)
        changed = pixels != previous
        rows, cols = np.flatnonzero(changed.any(1)), np.flatnonzero(changed.any(0))
        top, left = (rows[0], cols[0]) if len(rows) else (0, 0)  # no change: one clear pixel
        bottom, right = (rows[-1] + 1, cols[-1] + 1) if len(rows) else (1, 1)
        box = np.where(changed, pixels, np.uint8(TRANSPARENT))[top:bottom, left:right]
        chunks += GifImagePlugin.getdata(image(box), offset=(int(left), int(top)), **frame_info)
        previous = pixels
    return b"".join([*chunks, b";"])  # the trailer


def play_gif_of(plain, sticky, env_id: str) -> bytes | None:
    """play_gif of two recorded episodes of `plain` (in Breakout, ones whose ball starts on either
    side) and one of `sticky`, one policy's evaluations without and with sticky actions; None where
    observations are not grids. An episode longer than its recording is shown for the recorded
    steps."""
    if plain.frames.ndim != 5:
        return None
    first = plain.frames[:, 0]
    other = next((i for i in range(1, len(first)) if not np.array_equal(first[i], first[0])), 1)
    played = [(plain, 0), (plain, other), (sticky, 0)]
    episodes = [result.frames[i, :result.lengths[i] + 1] for result, i in played]
    ends = [f"over at {result.lengths[i]}" if result.lengths[i] < result.frames.shape[1]
            else f"{len(episode) - 1} of {result.lengths[i]}" for (result, i), episode
            in zip(played, episodes)]
    titles = ["episode 1", "episode 2", "sticky 0.1"]
    if env_id == "Breakout-MinAtar":
        titles[:2] = [
            f"ball from the {'left' if e[0, ..., BREAKOUT_BALL].max(0).argmax() < 5 else 'right'}"
            for e in episodes[:2]
        ]
    return play_gif(episodes, titles, GAME_CHANNELS.get(env_id), ends=ends)


# --------------------------------------------------------------------------------------------------
# Behaviour at evaluation
# --------------------------------------------------------------------------------------------------
def breakout_ball_lost(final_obs: np.ndarray, terminated: np.ndarray) -> dict[str, np.ndarray]:
    """Where each terminated Breakout episode lost the ball: its column and the paddle's column on
    the losing step, and the bricks still standing."""
    lost = final_obs[terminated]
    return {"ball_column": lost[..., BREAKOUT_BALL].max(axis=1).argmax(axis=-1),
            "paddle_column": lost[:, -1, :, BREAKOUT_PADDLE].argmax(axis=-1),
            "bricks_left": lost[..., BREAKOUT_BRICK].sum(axis=(1, 2)).astype(int)}


def counts(values) -> dict[str, int]:
    """{value: how often}, for summary.json (JSON keys are strings)."""
    unique, number = np.unique(np.asarray(values), return_counts=True)
    return {str(u.item()): int(n) for u, n in zip(unique, number)}


def behaviour_numbers(result, breakout: bool) -> dict:
    """summary.json's numbers for one evaluation (a host copy of an EvalResult)."""
    numbers = {
        "mean": float(result.returns.mean()), "std": float(result.returns.std()),
        "min": float(result.returns.min()), "max": float(result.returns.max()),
        "mean_length": float(result.lengths.mean()),
        "distinct_episodes": int(len(np.unique(result.fingerprint))),
        "terminated": int(result.terminated.sum()),
        "return_counts": counts(result.returns.astype(int) if breakout else result.returns),
        "length_quartiles": np.percentile(result.lengths, [0, 25, 50, 75, 100]).tolist(),
    }
    if breakout:
        lost = breakout_ball_lost(result.final_obs, result.terminated)
        ball_minus_paddle = lost["ball_column"] - lost["paddle_column"]
        numbers["ball_lost"] = {"ball_minus_paddle_column": counts(ball_minus_paddle),
                                "bricks_left": counts(lost["bricks_left"])}
    return numbers


def behaviour_figure(results: dict, breakout: bool, title: str) -> plt.Figure:
    """Returns, lengths, distinct episodes and how episodes end for each evaluation in `results`
    ({label: EvalResult on the host}), and for Breakout where the ball is lost."""
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    fig.subplots_adjust(left=0.05, right=0.97, bottom=0.08, top=0.88, wspace=0.3, hspace=0.35)
    fig.suptitle(title, fontsize=13)
    labels = list(results)
    colours = plt.get_cmap("tab10").colors
    for label, colour in zip(labels, colours):
        r = results[label]
        bins = np.arange(r.returns.min(), r.returns.max() + 2) - 0.5 if breakout else 30
        axes[0, 0].hist(r.returns, bins=bins, histtype="step", linewidth=1.8, color=colour,
                        label=f"{label}: mean {r.returns.mean():.1f}")
        axes[0, 1].hist(r.lengths, bins=30, histtype="step", linewidth=1.8, color=colour)
    axes[0, 0].set(title="Return of each episode" + (" (bricks broken)" if breakout else ""),
                   xlabel="return", ylabel="episodes")
    axes[0, 1].set(title="Episode length", xlabel="steps", ylabel="episodes")
    distinct = [len(np.unique(results[label].fingerprint)) for label in labels]
    bars = axes[0, 2].bar(labels, distinct, color=colours[:len(labels)])
    axes[0, 2].bar_label(bars)
    axes[0, 2].set(title=f"Distinct episodes (of {len(results[labels[0]].returns)} played)",
                   ylabel="episodes with their own observation sequence")
    terminated = np.array([results[label].terminated.mean() for label in labels])
    axes[1, 2].bar(labels, terminated, color=colours[:len(labels)])
    axes[1, 2].set(title="Ended by the game" + (" (ball lost)" if breakout else ""), ylim=(0, 1),
                   ylabel="share of episodes (the rest: time limit)")
    if breakout:
        lost = breakout_ball_lost(results[labels[0]].final_obs, results[labels[0]].terminated)
        grid = np.zeros((10, 10), int)
        np.add.at(grid, (lost["paddle_column"], lost["ball_column"]), 1)
        image = axes[1, 0].imshow(grid, origin="lower", cmap="viridis")
        fig.colorbar(image, ax=axes[1, 0], label="episodes")
        axes[1, 0].set(title=f"Where the ball is lost ({labels[0]})", xlabel="ball column",
                       ylabel="paddle column", xticks=range(10), yticks=range(10))
        for label, colour in zip(labels, colours):
            r = results[label]
            left = breakout_ball_lost(r.final_obs, r.terminated)["bricks_left"]
            axes[1, 1].hist(left, bins=np.arange(0, 32) - 0.5, histtype="step", linewidth=1.8,
                            color=colour)
        axes[1, 1].set(title="Bricks left on the wall when the ball is lost", xlabel="bricks",
                       ylabel="episodes")
    else:
        axes[1, 0].axis("off")
        axes[1, 1].axis("off")
    # One legend for all panels: each evaluation has one colour throughout.
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="upper center", ncols=len(labels),
               fontsize=10, bbox_to_anchor=(0.5, 0.955))
    for ax in axes.flat:
        ax.tick_params(labelsize=10)
    axes[0, 2].tick_params(axis="x", labelrotation=15)
    axes[1, 2].tick_params(axis="x", labelrotation=15)
    return fig


# --------------------------------------------------------------------------------------------------
# Learning curves
# --------------------------------------------------------------------------------------------------
def learning_curve_figure(steps, seconds, returns, title: str) -> plt.Figure:
    """Mean return of the training episodes that ended in each iteration, against environment steps
    and against seconds of training."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.88, wspace=0.25)
    fig.suptitle(title, fontsize=13)
    for ax, x, xlabel in ((axes[0], steps, "environment steps"),
                          (axes[1], seconds, "seconds of training")):
        ax.plot(x, returns, linewidth=1.5)
        ax.set(xlabel=xlabel, ylabel="episodic return (training episodes)")
        ax.grid(alpha=0.3)
    return fig


def figure_to_png(fig: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=72)
    plt.close(fig)
    return buffer.getvalue()


def headline_first(headline: str) -> list[str]:
    """The policies of EVALUATION_PAIRS, `headline` ("sampled" or "greedy") first."""
    if headline not in EVALUATION_PAIRS:
        raise ValueError(f"the headline policy {headline!r} is none of {list(EVALUATION_PAIRS)}")
    return [headline, *(policy for policy in EVALUATION_PAIRS if policy != headline)]


def report_evaluations(results: dict, writer, run_dir: str, step: int, title: str,
                       env_id: str, headline: str = "sampled") -> dict:
    """Prints, logs and draws (play.gif, behaviour.png) the final evaluations, `results` holding
    each of EVALUATION_PAIRS' results stacked, by policy; returns summary.json's `eval`: the results
    of protocol "" at its top level, the others under their protocol. play.gif shows the `headline`
    policy (the script's HEADLINE_POLICY). It empties `results`."""
    breakout = env_id == "Breakout-MinAtar"  # Breakout's behaviour has panels of its own
    fetched = {}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # The GIF is encoded in a thread (Pillow's encoder releases the GIL) once the headline pair
        # is here, while the other pair plays and matplotlib draws.
        for policy in headline_first(headline):
            # A pair's device arrays go once its host copy is made, and only the headline pair's
            # recorded frames come over, for play.gif.
            pair, pair_results = EVALUATION_PAIRS[policy], results.pop(policy)
            if policy != headline:
                pair_results = pair_results._replace(frames=None)
            pair_results = jax.device_get(pair_results)
            fetched |= {i: jax.tree.map(lambda x: x[k], pair_results) for k, i in enumerate(pair)}
            if policy == headline:  # without and with sticky actions
                gif = pool.submit(play_gif_of, *(fetched[i] for i in pair), env_id)
        by_protocol, labelled = {}, {}
        for i, (protocol, mode) in enumerate(EVALUATIONS):
            result = fetched[i]
            assert result.finished.all(), (
                "an evaluation episode outran the environment's time limit"
            )
            labelled[f"{mode}, {protocol.replace('_', ' ')}" if protocol else mode] = result
            numbers = behaviour_numbers(result, breakout)
            by_protocol.setdefault(protocol, {})[mode] = numbers
            # MinAtar's protocol has no time limit: how many episodes the safety bound stopped
            if protocol:
                stopped = result.lengths >= evaluation.SAFETY_BOUND
                numbers["safety_bound_episodes"] = int(stopped.sum())
            tag = evaluation.return_tag(protocol, mode)
            writer.add_scalar(tag, numbers["mean"], step)
            writer.add_scalar(tag.replace("_return", "_distinct_episodes"),
                              numbers["distinct_episodes"], step)
            print(f"eval ({mode:>7}{', ' + protocol.replace('_', ' ') if protocol else ''}, "
                  f"{len(result.returns)} episodes): "
                  f"return {numbers['mean']:.2f} ± {numbers['std']:.2f}, "
                  f"{numbers['distinct_episodes']} distinct")
        logger.write_picture(writer, run_dir, "behaviour.png", "eval/behaviour",
                      figure_to_png(behaviour_figure(labelled, breakout, title)), step)
        if gif.result() is not None:
            logger.write_picture(writer, run_dir, "play.gif", "eval/play", gif.result(), step)
    return {**by_protocol.pop(""), **by_protocol}


def evaluate_and_draw(play, params, history, log, run_dir: str, step: int, title: str,
                      env_id: str, headline: str = "sampled") -> dict:
    """Plays the final evaluations (`play(params, policy)`, from
    evaluation.compile_final_evaluation) and draws them and the learning curve; summary.json's
    `eval`. play.gif shows the `headline` policy (the script's HEADLINE_POLICY), whose pair the
    devices play first, while the host draws the learning curve (a call waits for a device that is
    still busy, so the other pair is queued after the drawing)."""
    first, second = headline_first(headline)
    results = {first: play(params, first)}
    if history.steps:
        figure = learning_curve_figure(*history, title)
        logger.write_picture(log, run_dir, "learning_curve.png", "charts/learning_curve",
                             figure_to_png(figure), step)
    results[second] = play(params, second)
    return report_evaluations(results, log, run_dir, step, f"{title}, step {step:,}", env_id,
                              headline)
