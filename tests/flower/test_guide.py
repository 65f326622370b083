"""The pieces of `dpfl flower guide`'s federation that need no running Flower: discovery fails fast with the reason,
the ServerApp leaves its verdict in the run directory, `dpfl flower check` exits non-zero on a failed run, `dpfl
flower keys` writes what Flower loads (the federations themselves: test_guide_federation.py, test_secure_federation.py,
integration tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr")

from cli_runner import cli  # noqa: E402
from dpfl.flower import clients  # noqa: E402
from dpfl.flower.clients import FederationError, discover  # noqa: E402
from dpfl.flower.verdict import FAILURE_NOTE  # noqa: E402

from results.fakes import make_accounted_run  # noqa: E402

from .helpers import CONFIG  # noqa: E402


class Reply:
    def __init__(self, node: int, pid: int | None, error: str | None = None) -> None:
        from types import SimpleNamespace

        self.metadata = SimpleNamespace(src_node_id=node)
        self.content = {"node": {"partition-id": pid}}
        self.error = SimpleNamespace(reason=error, code=1)

    def has_error(self) -> bool:
        return self.error.reason is not None


class Grid:
    """Nodes connect over time: `schedule[k]` is the node list at the k-th poll; node n holds partition `pids[n]`."""

    def __init__(self, schedule: list[list[int]], pids: dict[int, int], errors: dict[int, str] | None = None):
        self.schedule, self.pids, self.errors, self.polls, self.asked = schedule, pids, errors or {}, 0, []

    def get_node_ids(self):
        nodes = self.schedule[min(self.polls, len(self.schedule) - 1)]
        self.polls += 1
        return nodes

    def send_and_receive(self, messages, timeout):
        nodes = [kw["dst_node_id"] for _, kw in messages]
        self.asked.append(nodes)
        return [Reply(n, self.pids[n], self.errors.get(n)) for n in nodes]


@pytest.fixture(autouse=True)
def _fake_messages(monkeypatch):
    monkeypatch.setattr(clients, "Message", lambda *a, **kw: (a, kw))  # Flower's needs a running federation


def test_each_node_is_asked_once_as_it_connects():
    grid = Grid([[], [11], [11, 12], [11, 12, 13]], {11: 2, 12: 0, 13: 1})
    found = discover(grid, 3, timeout=10, reply_timeout=5, poll=0.0)
    assert found.nodes == {0: 12, 1: 13, 2: 11} and found.records == {0: None, 1: None, 2: None}  # no config sent
    assert grid.asked == [[11], [12], [13]]


def test_a_missing_node_fails_with_its_partition_id_and_progress_is_said():
    said: list[str] = []
    grid = Grid([[11]], {11: 0})
    with pytest.raises(FederationError, match=r"1 of 2 SuperNodes connected in 0.3 s: no SuperNode holds partition-id "
                                              r"1 \(the run has clients 0..1: start one SuperNode per client"):
        discover(grid, 2, timeout=0.3, reply_timeout=5, say=said.append, poll=0.05, note_every=0.1)
    assert said and said[0].startswith("waiting for SuperNodes: 1 of 2 connected, missing partition-id 1;")


@pytest.mark.parametrize("grid, message", [
    (Grid([[11, 12]], {11: 0, 12: 5}), "node 12 holds partition-id 5, but the run has clients 0..1"),
    (Grid([[11], [11, 12]], {11: 0, 12: 0}), "nodes 11 and 12 both hold partition-id 0"),
    (Grid([[11, 12]], {11: 0, 12: 0}), "nodes 11 and 12 both hold partition-id 0"),
    (Grid([[11]], {11: 0}, {11: "start the SuperNode with --node-config"}),
     "node 11 cannot take part: start the SuperNode"),
], ids=["out-of-range", "duplicate", "duplicate-at-once", "node-error"])
def test_a_node_that_cannot_take_part_stops_the_run_at_once(grid, message):
    with pytest.raises(FederationError, match=message):
        discover(grid, 2, timeout=3600, reply_timeout=5, poll=0.0)  # no waiting for the timeout


def _main(app, grid=None):
    """The ServerApp's main function, called as Flower would (its run config given)."""
    from flwr.app import Context, RecordDict

    def call(run_config: dict) -> None:
        app._main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    return call


def test_the_serverapp_leaves_why_it_failed_in_the_run_directory(tmp_path: Path):
    from dpfl.flower.server_app import server_app

    class NoNodes:
        def get_node_ids(self):
            return []

    out = tmp_path / "run"
    with pytest.raises(FederationError):
        _main(server_app(config=str(CONFIG), out=str(out), node_timeout=0.0), NoNodes())({})
    assert (out / FAILURE_NOTE).read_text().startswith("0 of 3 SuperNodes connected in 0 s: no SuperNode holds")
    code, stdout, stderr = cli("flower", "check", out, "--wait", "0")
    assert code == 1 and "error: the Flower run failed: 0 of 3 SuperNodes connected" in stderr

    # a config error, before any strategy: still said there
    bad = tmp_path / "bad"
    with pytest.raises(Exception, match="data.clients"):
        _main(server_app(config=str(CONFIG), out=str(bad)))({"set": "data.clients=0"})
    assert "data.clients" in (bad / FAILURE_NOTE).read_text()

    # a directory holding another run is never written to
    done = make_accounted_run(tmp_path / "done")
    with pytest.raises(ValueError, match="already exists"):
        _main(server_app(config=str(CONFIG), out=str(done)))({})
    assert not (done / FAILURE_NOTE).exists()


def test_check_prints_the_report_of_a_finished_run_and_exits_1_otherwise(tmp_path: Path):
    done = make_accounted_run(tmp_path / "done")
    code, stdout, _ = cli("flower", "check", done)
    assert code == 0 and "guarantee: sample-level DP" in stdout and f"run directory: {done}" in stdout
    code, _, stderr = cli("flower", "check", tmp_path / "never", "--wait", "0")
    assert code == 1 and "the Flower run did not finish" in stderr and "does not exist" in stderr
    unfinished = make_accounted_run(tmp_path / "unfinished", complete=False)
    code, _, stderr = cli("flower", "check", unfinished, "--wait", "0.2")
    assert code == 1 and "has no summary.json" in stderr


def test_keys_are_what_flower_loads(tmp_path: Path):
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key

    folder = tmp_path / "keys"
    code, stdout, stderr = cli("flower", "keys", folder, "--nodes", "2")
    assert code == 0, stderr
    for i in range(2):
        key = load_ssh_private_key((folder / f"node{i}").read_bytes(), None)  # flower-supernode's loader
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert try_load_public_key(folder / f"node{i}.pub")  # `flwr supernode register`'s loader
        assert (folder / f"node{i}").stat().st_mode & 0o077 == 0
    ca = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((folder / "server.crt").read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    ca_bytes, node0 = (folder / "ca.crt").read_bytes(), (folder / "node0").read_bytes()
    code, stdout, _ = cli("flower", "keys", folder, "--nodes", "3")  # again: only the missing pair is written
    assert code == 0 and "wrote node2, node2.pub; kept ca.crt" in stdout
    assert (folder / "ca.crt").read_bytes() == ca_bytes and (folder / "node0").read_bytes() == node0
    (folder / "server.key").unlink()
    code, _, stderr = cli("flower", "keys", folder)
    assert code == 2 and "but not all of" in stderr  # a half CA is the user's to sort out, never patched


def test_guide_secure_prints_tls_and_registration(tmp_path: Path):
    code, out, err = cli("flower", "guide", "--nodes", "2", "--secure", tmp_path / "k")
    assert code == 0, err
    k = tmp_path / "k"
    assert f"dpfl flower keys {k} --nodes 2" in out
    assert (f"flower-superlink --ssl-ca-certfile {k}/ca.crt --ssl-certfile {k}/server.crt --ssl-keyfile "
            f"{k}/server.key --enable-supernode-auth") in out
    assert f"flwr supernode register {k}/node1.pub dpfl-local" in out
    assert f"flower-supernode --root-certificates {k}/ca.crt --auth-supernode-private-key {k}/node1 " in out
    assert "--insecure" not in out.replace("`--insecure`", "")


def test_nothing_uses_flowers_deprecated_run_simulation():
    from .helpers import ROOT

    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").glob("*.md"),
             *(ROOT / "examples").rglob("*.md"), ROOT / "README.md"]
    using = [str(f.relative_to(ROOT)) for f in files if f != Path(__file__).resolve() and
             ("import run_simulation" in f.read_text() or "run_simulation(" in f.read_text())]
    assert not using, using
