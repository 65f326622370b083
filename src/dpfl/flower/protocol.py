"""What the server and the nodes say to each other, and which dpfl algorithms a Flower federation can run.

Messages (Flower message types):
- query, `{"config": {"yaml": <the dpfl config>}}`: the node loads its records for that config (its silo file, node
  config `silo`, when the config reads the user's own files) and answers `{"node": {"partition-id": i, "records":
  n}}`: its dpfl client id (node config `partition-id`) and its training-record count, which the server calibrates
  the noise for (with the user's own files it has no other way to know it).
- train: `{"global": <global model>, "plan": <TrainPlan as a ConfigRecord>}`; the node answers
  `{"upload": <its upload>, "facts": {"steps": T, "noise-sq-norm": ||sum xi||^2}}` (the noise norm only when the
  server sent the run seed; a node's secret noise stays on the node).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GLOBAL, PLAN, UPLOAD, FACTS, NODE, CONFIG = "global", "plan", "upload", "facts", "node", "config"
PARTITION_ID, RECORDS, SILO, YAML = "partition-id", "records", "silo", "yaml"  # SILO: a node config key
DEVICE = "device"  # a node config key: where the node trains (cpu, cuda, cuda:N); default the run config's device
SHARED_SEED_NOTE = ("the server knew the clients' seeds (run config shared-seed = true): their batches and noise are "
                    "the simulation's, for testing equivalence only; NOT private against the server")
SECRET_SEED_NOTE = ("each node drew its batches and noise from its own secret seed: the server never knew the "
                    "clients' noise (nor its norm: metrics.jsonl has no noise_stat_empirical)")
NODE_SILOS_NOTE = ("each node read only its own silo (its node config `silo`) and checked it against the config's "
                   "data.schema; the server read only the test file (data.test) and each client's training-record "
                   "count, which its node reported (the noise calibration and the sampling rate use it)")
SERVER_DATA_NOTE = ("demo simplification: the server rebuilt the dataset split from the config for the clients' "
                    "record counts (noise calibration) and the test set; it never trained on or read training "
                    "records, which only the nodes use")


@dataclass(frozen=True)
class TrainPlan:
    """Everything a node needs to run client `client`'s local program in round `round` (0-based).

    `upload_noise`: the calibrated noise multiplier of the upload stage (update clipping + noise), or -1 for a stage
    without noise to set. `seed`: the run seed when it is shared with the nodes (testing only), else -1 (the node
    uses its own secret seed). `records`: the client's record count the server calibrated for (the node checks it).
    """

    round: int
    client: int
    records: int
    batch_size: int
    noise_multiplier: float
    upload_noise: float
    seed: int
    max_elements: int
    config_yaml: str

    def to_config(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_config(cls, record: Any) -> TrainPlan:
        d = dict(record)
        return cls(int(d["round"]), int(d["client"]), int(d["records"]), int(d["batch_size"]),
                   float(d["noise_multiplier"]), float(d["upload_noise"]), int(d["seed"]), int(d["max_elements"]),
                   str(d["config_yaml"]))


def unsupported(run: Any) -> str | None:
    """Why the Flower path cannot run `run` (a FederatedRun), or None if it can."""
    from dpfl.algorithms.client.udp import ClippedNoisyUpdate
    from dpfl.algorithms.client.upload import FullUpdate

    alg = run.algorithm
    agg, up = alg.aggregator, alg.upload
    if agg.secure or up.secure_sum:
        return "secure aggregation is not implemented over Flower messages"
    if alg.personal is not None or agg.personalises_starts:
        return "personal or stateful client programs (client state, personal start models) are not supported"
    if agg.asks_clients:
        return "R-DPCFL's private selection questions (clients scoring cluster models) are not supported"
    if agg.privileged:
        return "oracle aggregators read the clients' noise, which a real server cannot"
    if agg.encodes_uploads:
        return "client-side encodings of the upload (PFA+) are not supported"
    if agg.encodes_broadcast:
        return "an encoded broadcast (MP-DP's perturbed model, with its key agreement between clients) is not supported"
    if run.update_hook is not None:
        return "privacy audits (canary hooks) run in simulation only"
    if type(up) not in (FullUpdate, ClippedNoisyUpdate):
        return f"upload stage {type(up).__name__} is not supported (full update, or update clipping + noise)"
    return None
