"""``artsvc evaluate`` and ``artsvc compare``: measurement and the promotion gate, as clients of the HTTP API.

stdout carries what scripts read as its last line: the evaluation id (or, with ``--json``, the evaluation or the
verdict as JSON). ``compare`` exits 0 on ACCEPT and 1 on REJECT, so a pipeline can gate on it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from service.cli.app import app, console
from service.cli.remote import ApiUrlOption, TokenOption, api_client, read_json_file


@app.command()
def evaluate(
    spec_file: Annotated[str, typer.Argument(metavar="SPEC.json", help="An EvaluationSpec JSON file, or - for stdin.")],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the evaluation to its end and show its summary.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the evaluation as JSON on the last line.")] = False,
    api_url: ApiUrlOption = None,
    token: TokenOption = None,
) -> None:
    """Queue an evaluation (a job's checkpoint or a baseline model on a split; best-of-N with n > 1)."""
    spec = read_json_file(spec_file)
    with api_client(api_url, token) as client:
        evaluation = client.submit_evaluation(spec)
        console.print(f"evaluation {evaluation['id']} ({evaluation['environment']}) is {evaluation['status']}", highlight=False)
        if wait:
            for event in client.events(evaluation["id"]):
                if event.event == "progress":
                    data = json.loads(event.data).get("data", {})
                    console.print(f"  {data.get('done')}/{data.get('total')} rollouts", highlight=False)
            evaluation = client.get_evaluation(evaluation["id"])
    if evaluation.get("summary"):
        show_summary(evaluation["summary"])
    if evaluation["status"] == "failed":
        console.print(f"[red]failed[/red]: {escape(str(evaluation.get('error')))}", soft_wrap=True)
    typer.echo(json.dumps(evaluation) if as_json else evaluation["id"])
    if wait and evaluation["status"] != "succeeded":
        raise typer.Exit(1)


def show_summary(summary: dict[str, Any]) -> None:
    """Pass rate and pass@k, then the failure table by outcome code."""
    label = f" [yellow]({summary['selection']})[/yellow]" if summary.get("selection") else ""
    pass_at = ", ".join(f"pass@{k} {v:.3f}" for k, v in summary.get("pass_at_k", {}).items())
    console.print(f"pass rate {summary['pass_rate']:.3f} on {summary['examples']} examples{label}; {pass_at}; "
                  f"mean reward {summary['mean_reward']:.3f}", soft_wrap=True, highlight=False)  # fmt: skip
    table = Table("outcome", "count", "share", "examples", title="failures")
    for row in summary.get("failures", []):
        table.add_row(escape(row["outcome"]), str(row["count"]), f"{row['share']:.3f}", escape(", ".join(row["examples"])))
    console.print(table)


@app.command()
def compare(
    baseline: Annotated[str, typer.Argument(metavar="BASELINE", help="A job or evaluation id.")],
    candidate: Annotated[str, typer.Argument(metavar="CANDIDATE", help="A job or evaluation id.")],
    min_delta: Annotated[float, typer.Option(help="Accuracy gain the interval's lower bound must clear.")] = 0.0,
    confidence: Annotated[float, typer.Option(help="Of the bootstrap intervals.")] = 0.95,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdict as JSON on the last line.")] = False,
    api_url: ApiUrlOption = None,
    token: TokenOption = None,
) -> None:
    """ACCEPT or REJECT CANDIDATE against BASELINE (GET /v1/compare); exit 0 on ACCEPT, 1 on REJECT."""
    with api_client(api_url, token) as client:
        verdict = client.compare(baseline, candidate, min_delta=min_delta, confidence=confidence)
    colour = "green" if verdict["decision"] == "ACCEPT" else "red"
    console.print(f"[{colour}]{verdict['decision']}[/{colour}]", highlight=False)
    if (overall := verdict.get("overall")) is not None:
        console.print(f"accuracy {overall['baseline']:.3f} -> {overall['candidate']:.3f} ({overall['delta']:+.3f}, "
                      f"{verdict['confidence']:.0%} interval [{overall['ci_low']:+.3f}, {overall['ci_high']:+.3f}]; "
                      f"{overall['candidate_only']} examples correct in the candidate only, "
                      f"{overall['baseline_only']} in the baseline only)", highlight=False)  # fmt: skip
        table = Table("outcome", "baseline", "candidate", "delta", "interval", "examples in / out", "regressed")
        for row in verdict["outcomes"]:
            table.add_row(escape(row["outcome"]), f"{row['baseline']:.3f}", f"{row['candidate']:.3f}", f"{row['delta']:+.3f}",
                          f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]",
                          f"{row['candidate_only']} / {row['baseline_only']}", "yes" if row["regressed"] else "")  # fmt: skip
        console.print(table)
    for reason in verdict["reasons"]:
        console.print(f"- {escape(reason)}", soft_wrap=True, highlight=False)
    if as_json:
        typer.echo(json.dumps(verdict))
    raise typer.Exit(0 if verdict["decision"] == "ACCEPT" else 1)


