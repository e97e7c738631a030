"""The figures, asserted on the matplotlib objects the tools build: farm-winrate's leaderboard bars,
farm-correlate's scatter, farm-plot's history, training curves and over-optimization figure."""

from __future__ import annotations

import itertools
import random

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from farmkit.tools import farm_correlate, farm_winrate

from farmkit.evaluate import plots

LONG = "llama7B_freelb_lr5e-5_AdvLr0_InitAdvMax10_AdvStep1_Projl2_MaxNorm0_yuxinRun"


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def invoke(cli, *args):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def text_boxes(figure):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Annotation, Text

    renderer = FigureCanvasAgg(
        figure
    ).get_renderer()  # pyplot detached the figure's canvas when it closed it
    return [
        Text.get_window_extent(t, renderer)
        for ax in figure.axes
        for t in ax.texts
        if isinstance(t, Annotation)
    ]


def preference_records(seed=0):
    rng = random.Random(seed)
    records = []
    for model, strength in (("strong", 0.8), ("zero", 0.0), (LONG, 0.4)):
        for i in range(60):
            longer = rng.random() < 0.5
            win = rng.random() < strength
            records.append(
                {
                    "instruction": f"task {i}",
                    "generator_1": "ref",
                    "generator_2": model,
                    "annotator": "judge_x",
                    "preference": 2 if win else 1,
                    "len_1": 500,
                    "len_2": 800 if longer else 300,
                }
            )
    return records


def test_leaderboard_bars_name_the_judge_share_an_axis_and_show_zero(tmp_path, figures):
    prefs = write_jsonl(tmp_path / "p.jsonl", preference_records())
    invoke(
        farm_winrate.cli, prefs, "--plot", tmp_path / "board.png", "-o", tmp_path / "board.jsonl"
    )
    (figure,) = figures
    title = " ".join(
        t.get_text() for t in [figure._suptitle, *(ax.title for ax in figure.axes)] if t is not None
    )
    assert "judge_x" in title and "ref" in title
    assert [ax.get_title() for ax in figure.axes] == [
        "win rate (%)",
        "length-controlled win rate (%)",
    ]
    assert figure.axes[0].get_xlim() == figure.axes[1].get_xlim() == (0.0, 100.0)
    for ax in figure.axes:
        assert len(ax.patches) == 3 and all(
            bar.get_width() > 0 for bar in ax.patches
        )  # "zero" is a sliver
        assert ax.get_position().width > 0.25  # the long label does not squeeze the bars
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels[0] == "strong" and labels[2] == "zero"  # best first
    assert (
        len(labels[1]) == plots.LABEL_CHARACTERS
        and labels[1].startswith("llama7B")
        and labels[1].endswith("yuxinRun")
    )


def test_leaderboard_without_length_control_has_one_panel(tmp_path, figures):
    prefs = write_jsonl(tmp_path / "p.jsonl", preference_records())
    invoke(
        farm_winrate.cli,
        prefs,
        "--plot",
        tmp_path / "board.png",
        "--no-length-control",
        "-o",
        tmp_path / "b.jsonl",
    )
    (figure,) = figures
    assert len(figure.axes) == 1 and figure.axes[0].get_xlim() == (0.0, 100.0)


def test_leaderboard_against_several_references_heads_each_group(tmp_path, figures):
    records = []
    for reference, models in (
        ("gpt4_1106_preview", {"gpt-3.5-turbo-0301": 0.1, "Mixtral-8x7B-Instruct-v0.1": 0.2}),
        ("text_davinci_003", {"Mistral-7B-ReMax-v0.1": 0.9, LONG: 0.5}),
    ):
        for model, share in models.items():
            records += [
                {
                    "instruction": f"task {i}",
                    "generator_1": reference,
                    "generator_2": model,
                    "preference": 2 if i < share * 40 else 1,
                }
                for i in range(40)
            ]
    prefs = write_jsonl(tmp_path / "p.jsonl", records)
    invoke(
        farm_winrate.cli,
        prefs,
        "--plot",
        tmp_path / "board.png",
        "--no-length-control",
        "-o",
        tmp_path / "b.jsonl",
    )
    (figure,) = figures
    (axes,) = figure.axes
    ticks = [t.get_text() for t in axes.get_yticklabels()]
    # the reference is a heading above its group; a row shows its generator, shortened only when it
    # is itself too long (not "gpt-3.5-turbo-030\u2026gpt4_1106_preview)")
    assert ticks == [
        "vs gpt4_1106_preview",
        "Mixtral-8x7B-Instruct-v0.1",
        "gpt-3.5-turbo-0301",
        "vs text_davinci_003",
        "Mistral-7B-ReMax-v0.1",
        plots.shorten(LONG),
    ]
    headings = [t for t in axes.get_yticklabels() if t.get_text().startswith("vs ")]
    assert all(t.get_fontweight() == "bold" for t in headings)
    assert len(axes.patches) == 4  # one bar per row, none for the headings
    # a line separates the groups
    assert [line for line in axes.lines if len(set(line.get_ydata())) == 1]


def crowded_boards(tmp_path):
    """An Elo board and a percent board with intervals, twelve models close together."""
    names = [f"model-number-{i}" for i in range(12)]
    elo = tmp_path / "benchmarks.csv"
    elo.write_text(
        "Model,Arena Elo\n" + "".join(f"{n},{1100 + 3 * i}\n" for i, n in enumerate(names))
    )
    percent = tmp_path / "alpaca_eval.csv"
    percent.write_text(
        ",win_rate,standard_error\n"
        + "".join(f"{n},{20 + 0.5 * i},{1.0 + i / 10}\n" for i, n in enumerate(names))
    )
    return elo, percent


def test_scatter_on_different_scales_has_no_diagonal_and_shows_intervals(tmp_path, figures):
    elo, percent = crowded_boards(tmp_path)
    invoke(
        farm_correlate.cli,
        elo,
        percent,
        "--score",
        "Arena",
        "--score",
        "win_rate",
        "--plot",
        tmp_path / "s.png",
    )
    (figure,) = figures
    (axes,) = figure.axes
    assert not [line for line in axes.lines if list(line.get_xdata()) == list(line.get_ydata())]
    (bars,) = axes.containers
    assert bars.has_yerr and not bars.has_xerr
    assert axes.get_xlabel() == "benchmarks: Arena Elo"
    assert axes.get_ylabel() == "alpaca_eval: win_rate"


def test_scatter_labels_do_not_overlap(tmp_path, figures):
    elo, percent = crowded_boards(tmp_path)
    invoke(
        farm_correlate.cli,
        elo,
        percent,
        "--score",
        "Arena",
        "--score",
        "win_rate",
        "--plot",
        tmp_path / "s.png",
    )
    (figure,) = figures
    boxes = text_boxes(figure)
    assert len(boxes) == 12
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)


def test_a_label_without_a_leader_is_nearest_its_own_point(tmp_path, figures):
    """The study's board (2026-11-27): sft and expiter at the same simulated win rate and half a
    point apart on gold. Each label placed beside a point (no leader line) must be nearer that point
    than any other, or a reader names the wrong one; before, "expiter" sat up-right of its point,
    right beside sft's, and "sft" down-left of its own, beside expiter's."""
    rates = {  # (sim, gold) of runs/study4
        "feedme": (40.5, 38.0),
        "sft-best-of-8": (40.0, 46.0),
        "dpo": (36.5, 35.5),
        "expiter": (36.25, 36.25),
        "sft": (36.25, 36.75),
        "ppo": (34.5, 40.0),
        "quark": (34.25, 37.25),
        "rc": (30.0, 34.75),
    }
    boards = [
        write_jsonl(
            tmp_path / f"leaderboard_{name}.jsonl",
            [
                {"generator": g, "win_rate": r[k], "standard_error": 3.3, "annotator": name}
                for g, r in rates.items()
            ],
        )
        for k, name in enumerate(("sim", "gold"))
    ]
    invoke(farm_correlate.cli, *boards, "--plot", tmp_path / "s.png")
    (figure,) = figures
    labels, _ = label_geometry(figure)
    points = [point for _, _, point in labels]
    assert {text for text, _, _ in labels} == set(rates)
    for text, box, point in labels:
        if any(t.get_text() == text and t.arrow_patch for t in figure.axes[0].texts):
            continue  # a leader line names the point

        def distance(p, box=box):
            return float(
                np.hypot(max(box.x0 - p[0], 0, p[0] - box.x1), max(box.y0 - p[1], 0, p[1] - box.y1))
            )

        own = distance(point)
        assert all(distance(p) > own for p in points if tuple(p) != tuple(point)), text


def real_sized_boards(tmp_path):
    """Our length-controlled board (farm-winrate JSONL, 55 models) and an AlpacaEval-style published
    CSV: most models crowded between 2 and 30, a few far above, as on AlpacaEval 2's board."""
    rng = random.Random(3)
    families = [
        "vicuna",
        "openbuddy-llama2",
        "gpt-3.5-turbo",
        "claude",
        "alpaca-farm-ppo",
        "oasst-sft",
    ]
    names = [f"{families[i % 6]}-{13 + i}b-v{i % 4}.{i % 3}" for i in range(51)]
    names += [
        "FuseChat-Gemma-2-9B-Instruct",
        "FuseChat-Llama-3.1-8B-Instruct",
        "phi-2",
        "gpt4_gamed",
    ]
    ours, theirs = {}, {}
    for i, name in enumerate(names):
        value = 2 + 28 * rng.random() ** 1.5 if i < 51 else 50 + 10 * (i - 51)
        ours[name], theirs[name] = value, value + rng.gauss(0, 0.8)
    ours["gpt4_gamed"], theirs["gpt4_gamed"] = 21.0, 12.2  # the largest residual
    mine = write_jsonl(
        tmp_path / "ours.jsonl",
        [
            {
                "generator": name,
                "length_controlled_win_rate": value,
                "lc_standard_error": 0.3,
                "annotator": "weighted_alpaca_eval_gpt4_turbo",
            }
            for name, value in ours.items()
        ],
    )
    published = tmp_path / "weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"
    published.write_text(
        ",win_rate,length_controlled_winrate,lc_standard_error\n"
        + "".join(f"{name},{value / 2},{value},0.4\n" for name, value in theirs.items())
    )
    return mine, published, ours, theirs


def label_geometry(figure):
    """(text, box, point in pixels) of each label, and the axes' box."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Annotation, Text

    renderer = FigureCanvasAgg(figure).get_renderer()
    (axes,) = figure.axes
    labels = [
        (t.get_text(), Text.get_window_extent(t, renderer), axes.transData.transform(t.xy))
        for t in axes.texts
        if isinstance(t, Annotation)
    ]
    return labels, axes.get_window_extent(renderer)


def _segments_cross(p, q, r, s):
    def side(a, b, c):
        return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])

    return side(p, q, r) * side(p, q, s) < 0 and side(r, s, p) * side(r, s, q) < 0


def test_scatter_of_a_real_sized_board_labels_extremes_inside_the_axes(tmp_path, figures):
    mine, published, ours, theirs = real_sized_boards(tmp_path)
    invoke(
        farm_correlate.cli,
        mine,
        published,
        "--score",
        "length_controlled_win_rate",
        "--score",
        "length_controlled_winrate",
        "--plot",
        tmp_path / "s.png",
    )
    (figure,) = figures
    (axes,) = figure.axes
    # axes named by file stem (AlpacaEval's minus _leaderboard) and column, and the judge when named
    assert axes.get_xlabel() == "ours: length_controlled_win_rate (weighted_alpaca_eval_gpt4_turbo)"
    assert axes.get_ylabel() == "weighted_alpaca_eval_gpt4_turbo: length_controlled_winrate"
    labels, frame = label_geometry(figure)
    shown = {text for text, _, _ in labels}
    # above 25 points only the extremes and the largest departures from the trend are labelled
    assert 10 <= len(labels) <= plots.SCATTER_LABELS
    assert {"gpt4_gamed", max(ours, key=ours.get), min(ours, key=ours.get)} <= shown
    for (a, box_a, _), (b, box_b, _) in itertools.combinations(labels, 2):
        assert not box_a.overlaps(box_b), (a, b)
    for text, box, _ in labels:
        assert (
            box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1
        ), text
    leaders = [(point, ((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2)) for _, box, point in labels]
    for (p, q), (r, s) in itertools.combinations(leaders, 2):
        assert not _segments_cross(p, q, r, s)


def test_scatter_labels_option(tmp_path, figures):
    mine, published, _, _ = real_sized_boards(tmp_path)
    for count in ("5", "0"):
        invoke(
            farm_correlate.cli,
            mine,
            published,
            "--score",
            "length_controlled_win_rate",
            "--score",
            "length_controlled_winrate",
            "--labels",
            count,
            "--plot",
            tmp_path / "s.png",
        )
    labels_5, labels_0 = (label_geometry(figure)[0] for figure in figures)
    assert len(labels_5) == 5 and "gpt4_gamed" in {text for text, _, _ in labels_5}
    assert labels_0 == []


def test_scatter_of_two_win_rate_boards_keeps_the_diagonal_and_names_the_judges(tmp_path, figures):
    models = {"a": (10, 12), "b": (40, 35), "c": (60, 70), "d": (90, 85)}
    sim = write_jsonl(
        tmp_path / "sim.jsonl",
        [
            {"generator": m, "win_rate": s, "standard_error": 2.0, "annotator": "sim_pool"}
            for m, (s, _) in models.items()
        ],
    )
    gold = write_jsonl(
        tmp_path / "gold.jsonl",
        [
            {"generator": m, "win_rate": g, "ci_low": g - 3, "ci_high": g + 4, "annotator": "gold"}
            for m, (_, g) in models.items()
        ],
    )
    invoke(farm_correlate.cli, sim, gold, "--plot", tmp_path / "s.png")
    (axes,) = figures[0].axes
    assert [line for line in axes.lines if list(line.get_xdata()) == list(line.get_ydata())]
    assert axes.get_xlabel() == "sim: win_rate (sim_pool)"
    assert axes.get_ylabel() == "gold: win_rate (gold)"
    (bars,) = axes.containers
    assert bars.has_xerr and bars.has_yerr


def test_comparable_scales():
    assert plots.comparable_scales([10, 50, 90], [20, 60, 95])
    assert not plots.comparable_scales([1100, 1250], [10, 50])


def test_training_curves_draw_every_numeric_field_of_every_run(tmp_path, figures):
    from farmkit.tools import farm_plot

    rm, dpo = tmp_path / "rm", tmp_path / "dpo"
    ppo_checkpoints = tmp_path / "ppo-checkpoints"
    for folder in (rm, dpo, tmp_path / "ppo", ppo_checkpoints):
        folder.mkdir()
    write_jsonl(
        rm / "metrics.jsonl",
        [{"step": s, "loss": 1 / s, "accuracy": 0.5 + s / 10} for s in (1, 2, 3)],
    )
    write_jsonl(
        dpo / "metrics.jsonl",
        [
            {"step": s, "loss": 2 / s, "rewards/margins": s, "epoch": 0.1 * s, "mode": "train"}
            for s in (2, 4)
        ],
    )
    # PPO keeps its metrics beside the model folder; a row may lack a field (no KL on the first step)
    write_jsonl(
        ppo_checkpoints / "metrics.jsonl",
        [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.3, "kl": 0.02}],
    )
    result = CliRunner().invoke(
        farm_plot.cli,
        ["curves", str(rm), str(dpo), str(tmp_path / "ppo"), "-o", str(tmp_path / "c.png")],
    )
    assert result.exit_code == 0, result.output
    (figure,) = figures
    panels = {ax.get_title(): ax for ax in figure.axes if ax.get_visible()}
    # (epoch is bookkeeping: left out unless named with --field)
    assert sorted(panels) == sorted(["loss", "accuracy", "rewards/margins", "reward", "kl"])
    assert {line.get_label(): list(line.get_xdata()) for line in panels["loss"].lines} == {
        "rm": [1, 2, 3],
        "dpo": [2, 4],
    }
    assert [(line.get_label(), list(line.get_ydata())) for line in panels["kl"].lines] == [
        ("ppo", [0.02])
    ]
    assert all(ax.get_xlabel() == "step" for ax in panels.values())
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["rm", "dpo", "ppo"]


def test_training_curves_read_cleanly(tmp_path, figures):
    """Whole steps on the x axis, values written out (no '+1e2' offset above a panel), nothing over a
    panel's title, and the runs named in the figure's title."""
    from farmkit.tools import farm_plot
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for name, rows in {
        "sft": [
            {"step": s, "loss": 2.5 / s, "learning_rate": 1e-5 * (1 - s / 10)} for s in (1, 2, 3)
        ],
        "ppo": [{"step": s, "reward": 100.0 + 0.0005 * s, "kl": 2e-5 * s} for s in (1, 2, 3, 4)],
    }.items():
        (tmp_path / name).mkdir()
        write_jsonl(tmp_path / name / "metrics.jsonl", rows)
    result = CliRunner().invoke(
        farm_plot.cli,
        ["curves", str(tmp_path / "sft"), str(tmp_path / "ppo"), "-o", str(tmp_path / "c.png")],
    )
    assert result.exit_code == 0, result.output
    (figure,) = figures
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    panels = {ax.get_title(): ax for ax in figure.axes if ax.get_visible()}
    for title, panel in panels.items():
        ticks = [t for t in panel.get_xticks() if panel.get_xlim()[0] <= t <= panel.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), (title, ticks)
        offset = panel.yaxis.get_offset_text()
        if offset.get_text():
            assert not offset.get_window_extent(renderer).overlaps(
                panel.title.get_window_extent(renderer)
            ), title
    reward = panels["reward"]
    assert reward.yaxis.get_offset_text().get_text() == ""
    assert all(t.get_text().startswith("100.00") for t in reward.get_yticklabels() if t.get_text())
    assert figure.get_suptitle() == "Training curves: sft, ppo"


def test_curves_draw_gold_against_kl_from_any_run_with_a_gold_judge(tmp_path, figures):
    """--x: an over-optimization curve (gold win rate against KL) from the metrics of any method
    run with --gold; rows without a gold figure (steps between checkpoints) are left out."""
    from farmkit.tools import farm_plot

    (tmp_path / "rloo").mkdir()  # the policy folder; its metrics are in rloo-checkpoints
    rloo = tmp_path / "rloo-checkpoints"
    rloo.mkdir()
    write_jsonl(
        rloo / "metrics.jsonl",
        [
            {"step": 1, "reward": 0.1, "kl": 0.0},
            {"step": 2, "reward": 0.3, "kl": 0.02, "gold_win_rate": 55.0, "gold_kl": 0.5},
            {"step": 3, "reward": 0.4, "kl": 0.04},
            {"step": 4, "reward": 0.6, "kl": 0.09, "gold_win_rate": 40.0, "gold_kl": 1.5},
        ],
    )
    bon = write_jsonl(
        tmp_path / "bon_metrics.jsonl",
        [
            {"step": n, "n": n, "gold_win_rate": w, "gold_kl": k}
            for n, w, k in ((1, 50, 0), (4, 60, 0.64))
        ],
    )
    args = ["curves", str(tmp_path / "rloo"), str(bon), "--x", "gold_kl"]
    result = CliRunner().invoke(
        farm_plot.cli, [*args, "--field", "gold_win_rate", "-o", str(tmp_path / "g.png")]
    )
    assert result.exit_code == 0, result.output
    (figure,) = figures
    (panel,) = [ax for ax in figure.axes if ax.get_visible()]
    assert panel.get_title() == "gold_win_rate" and panel.get_xlabel() == "gold_kl"
    assert {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in panel.lines
    } == {"rloo": ([0.5, 1.5], [55.0, 40.0]), "bon_metrics.jsonl": ([0, 0.64], [50, 60])}
    result = CliRunner().invoke(
        farm_plot.cli, [*args[:2], "--x", "nothing", "-o", str(tmp_path / "n.png")]
    )
    assert "--x nothing: no run has that metric" in str(result.exception)


def test_training_curves_name_a_bad_line_and_a_folder_without_metrics(tmp_path):
    from farmkit.tools import farm_plot

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_bytes(b'{"step": 1, "loss": 1}\n[1, 2]\n')
    result = CliRunner().invoke(
        farm_plot.cli, ["curves", str(tmp_path / "run"), "-o", str(tmp_path / "c.png")]
    )
    assert (
        str(result.exception)
        == f"{tmp_path / 'run' / 'metrics.jsonl'}:2: a list; expected one JSON object per line with step"
    )
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(
        farm_plot.cli, ["curves", str(tmp_path / "empty"), "-o", str(tmp_path / "c.png")]
    )
    assert str(result.exception).startswith(f"{tmp_path / 'empty'}: no metrics.jsonl in it")
    assert not (tmp_path / "c.png").exists()


def test_overopt_rows_and_figure_from_any_runs(tmp_path, figures):
    from farmkit.tools import farm_plot

    from farmkit.evaluate.overopt import best_of_n_kl
    from farmkit.methods.bon import rerank

    prompts = [f"task {i}" for i in range(4)]
    # four samples per prompt scored by the reward model "rm"; the gold reward is the records' own
    scored = write_jsonl(
        tmp_path / "scored.jsonl",
        [
            {
                "instruction": p,
                "output": f"{p} answer {k}",
                "sample_index": k,
                "reward": float((k * 7 + i) % 4),
                "gold_reward": (k + i) % 3 / 3,
                "generator": "sft",
            }
            for i, p in enumerate(prompts)
            for k in range(4)
        ],
    )
    bon = list(rerank(str(scored), [1, 2, 4], "rm"))
    assert [r["generator"] for r in bon[::4]] == ["rm-best-of-1", "rm-best-of-2", "rm-best-of-4"]
    assert [r["sample_index"] for r in bon[:4]] == [
        0,
        0,
        0,
        0,
    ]  # the best of one sample is the first
    assert all(r["reward"] == 3.0 for r in bon[8:])  # the best of all four has the top reward
    bon_path = write_jsonl(tmp_path / "bon_rm.jsonl", bon)
    ppo_path = write_jsonl(
        tmp_path / "ppo_rm.jsonl",
        [
            {
                "instruction": p,
                "output": "ppo says",
                "reward": 2.0 + step,
                "gold_reward": 0.4,
                "generator": f"ppo-rm-step-{step}",
            }
            for step in (1, 2)
            for p in prompts
        ],
    )
    (tmp_path / "ppo_rm-checkpoints").mkdir()
    write_jsonl(
        tmp_path / "ppo_rm-checkpoints" / "metrics.jsonl",
        [{"step": 1, "kl": 0.5}, {"step": 2, "kl": 1.25}],
    )
    systems = [f"rm-best-of-{n}" for n in (1, 2, 4)] + ["ppo-rm-step-1", "ppo-rm-step-2"]
    board = write_jsonl(
        tmp_path / "gold.jsonl",
        [
            {"generator": s, "reference": "base", "win_rate": 40.0 + i, "standard_error": 1.0}
            for i, s in enumerate(systems)
        ],
    )
    result = CliRunner().invoke(
        farm_plot.cli,
        [
            "overopt",
            str(board),
            str(bon_path),
            str(ppo_path),
            "--ppo-run",
            f"rm={tmp_path / 'ppo_rm'}",
            "--label",
            "rm=my RM",
            "-o",
            str(tmp_path / "o.png"),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = {
        row["system"]: row
        for row in map(orjson.loads, result.stdout.splitlines())
        if "system" in row
    }
    assert sorted(rows) == sorted(systems)
    assert (
        rows["rm-best-of-4"]["kl"]
        == pytest.approx(best_of_n_kl(4))
        == pytest.approx(1.3862943611 - 0.75)
    )
    assert rows["rm-best-of-1"]["kl"] == 0.0
    assert (rows["ppo-rm-step-1"]["kl"], rows["ppo-rm-step-2"]["kl"]) == (0.5, 1.25)
    assert (
        rows["ppo-rm-step-2"]["gold_reward"] == pytest.approx(0.4)
        and rows["rm-best-of-4"]["surrogate_reward"] == 3.0
    )
    (figure,) = figures
    assert [ax.get_title() for ax in figure.axes] == [
        "reward model: my RM",
        "gold against KL",
        "best-of-n sweep",
    ]
    kl_lines = {line.get_label(): list(line.get_xdata()) for line in figure.axes[1].lines}
    assert kl_lines["ppo, my RM"] == [0.5, 1.25] and len(kl_lines["best-of-n, my RM"]) == 3
