"""Proposers on a real store and a real git workspace: the search never proposes a configuration
twice (failed ones included, across processes sharing the store); the scripted proposer replays
files and patches in order; the agent proposer runs a real command with the brief and the
workspace as arguments, without a shell, under a time limit."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import optuna
import pytest

from loop.agent import AgentError, AgentProposer, agent_argv
from loop.proposers import Outcome, SearchProposer, make_sampler, space_size
from loop.scripted import ScriptedProposer, ScriptError, read_steps
from loop.store import Ledger, open_study
from loop.tasks import load_task
from loop.workspace import open_workspace

SPACE = {"a": [1, 2, 3], "b": ["x", "y"]}


def _finish(study, proposal, status: str) -> None:
    proposal.trial.set_user_attr("status", status)
    if status == "crash":
        study.tell(proposal.trial, state=optuna.trial.TrialState.FAIL)
    else:
        study.tell(proposal.trial, 1.0)


def test_search_covers_the_space_once_across_processes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = open_study(url, "s", SPACE, seed=3)
    first = SearchProposer(study, tmp_path / "c.py", SPACE, "p1", Ledger(url, "s"))
    other = SearchProposer(
        open_study(url, "s", SPACE), tmp_path / "c.py", SPACE, "p2", Ledger(url, "s")
    )
    seen = []
    for i in range(space_size(SPACE)):
        proposer = first if i % 2 else other
        p = proposer.propose()
        assert p is not None
        seen.append(repr(sorted(p.params.items())))
        _finish(study, p, "crash" if i == 0 else "discard")  # the first one fails to verify
    assert len(set(seen)) == space_size(SPACE)
    assert first.propose() is None and other.propose() is None


def test_samplers_by_name() -> None:
    assert isinstance(make_sampler(SPACE), optuna.samplers.GridSampler)
    assert isinstance(make_sampler(SPACE, kind="tpe"), optuna.samplers.TPESampler)
    assert isinstance(make_sampler(SPACE, kind="random"), optuna.samplers.RandomSampler)
    with pytest.raises(ValueError, match="unknown sampler"):
        make_sampler(SPACE, kind="annealing")


def _workspace(tmp_path: Path):
    task = load_task("rmsnorm")
    source = (task.folder / "torch_rmsnorm.py").read_text()
    return task, open_workspace(tmp_path / "ws", task.folder, "torch_rmsnorm.py", source)


def test_scripted_replays_files_and_patches_in_order(tmp_path: Path) -> None:
    _, ws = _workspace(tmp_path)
    script = tmp_path / "script"
    script.mkdir()
    (script / "01_first.py").write_text('"""First step."""\nLANGUAGE = "torch"\n')
    (script / "02_second.patch").write_text(
        "Second step\n---\n--- a/rmsnorm/torch_rmsnorm.py\n+++ b/rmsnorm/torch_rmsnorm.py\n"
        '@@ -1,2 +1,3 @@\n """First step."""\n+X = 1\n LANGUAGE = "torch"\n'
    )
    (script / "03_broken.diff").write_text("--- a/nothing\n+++ b/nothing\n@@ -1 +1 @@\n-a\n+b\n")
    (script / "notes.txt").write_text("not a step")
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = open_study(url, "s", {})
    proposer = ScriptedProposer(study, Ledger(url, "s"), "me", ws, read_steps(script))
    one = proposer.propose()
    assert one.description == "01_first.py: First step." and one.error is None
    assert ws.candidate.read_text() == '"""First step."""\nLANGUAGE = "torch"\n'
    _finish(study, one, "keep")
    two = proposer.propose()
    assert two.error is None and "X = 1" in ws.candidate.read_text()
    _finish(study, two, "discard")
    three = proposer.propose()
    assert three.error and "03_broken.diff does not apply" in three.error
    _finish(study, three, "crash")
    assert proposer.propose() is None
    assert [k for k in Ledger(url, "s").claimed() if k.startswith("step:")] == [
        "step:0000:01_first.py",
        "step:0001:02_second.patch",
        "step:0002:03_broken.diff",
    ]
    with pytest.raises(ScriptError, match=r"no \*\.py"):
        read_steps(tmp_path / "ws" / ".git" / "refs")


AGENT = """
import sys
from pathlib import Path

brief, workspace = Path(sys.argv[1]), Path(sys.argv[2])
text = brief.read_text()
assert text.index("pipeline the chunk loads") < text.index("## Task"), text[:300]
(workspace / "torch_rmsnorm.py").write_text(
    (workspace / "torch_rmsnorm.py").read_text() + "\\n# agent was here: " + sys.argv[3] + "\\n"
)
if len(sys.argv) > 4:
    import time
    time.sleep(float(sys.argv[4]))
"""


def test_agent_edits_the_candidate_with_the_brief(tmp_path: Path) -> None:
    _, ws = _workspace(tmp_path)
    agent = tmp_path / "my agent.py"
    agent.write_text(AGENT)
    command = shlex.join([sys.executable, str(agent)]) + " {brief} {workspace} '; touch pwned'"
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = open_study(url, "s", {})
    brief = "# Brief\n\n## Ideas\n\n- pipeline the chunk loads\n\n## Task\n"
    proposer = AgentProposer(
        study, Ledger(url, "s"), "me", ws, command, lambda: brief, tmp_path / "logs", 60
    )
    p = proposer.propose()
    assert p.error is None and not p.extra["unchanged"], (tmp_path / "logs").glob("*.log")
    assert p.extra["agent"]["returncode"] == 0
    assert ws.candidate.read_text().endswith("# agent was here: ; touch pwned\n")
    assert not (ws.task_dir / "pwned").exists() and not Path("pwned").exists()
    assert (tmp_path / "logs" / f"brief-{p.trial_number}.md").read_text() == brief
    assert p.key.startswith("source:")
    proposer.feedback(p, Outcome("discard", 1.0))


def test_agent_past_its_time_limit_is_killed(tmp_path: Path) -> None:
    _, ws = _workspace(tmp_path)
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    command = shlex.join([sys.executable, str(agent), "{brief}", "{workspace}", "slow", "60"])
    url = f"sqlite:///{tmp_path / 's.db'}"
    proposer = AgentProposer(
        open_study(url, "s", {}),
        Ledger(url, "s"),
        "me",
        ws,
        command,
        lambda: "pipeline the chunk loads\n## Task\n",
        tmp_path / "logs",
        timeout_s=3,
    )
    p = proposer.propose()
    assert p.extra["agent"]["timed_out"] and p.extra["agent"]["seconds"] < 30


def test_agent_command_errors(tmp_path: Path) -> None:
    assert agent_argv("run --x={workspace}/a '{brief}'", Path("b.md"), Path("/w w")) == [
        "run",
        "--x=/w w/a",
        "b.md",
    ]
    with pytest.raises(AgentError, match="--agent-command"):
        agent_argv("run 'unclosed", Path("b"), Path("w"))
    with pytest.raises(AgentError, match="empty"):
        agent_argv("   ", Path("b"), Path("w"))
