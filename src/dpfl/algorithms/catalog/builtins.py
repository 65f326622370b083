"""dpfl's own algorithms, in the order the config lists them: one registration each (name, factory, params model,
mechanisms, the first being the default). `dpfl.algorithms.registry` loads this table before any lookup."""

from __future__ import annotations

from dpfl.algorithms.catalog import (clustered, fedavg, fedceo, mpdp, noisy, pfa, personal, robust_hdp, splitting,
                                     weighted)
from dpfl.algorithms.registry import AlgorithmSpec

__all__ = ["BUILTINS"]

BUILTINS: tuple[AlgorithmSpec, ...] = (
    AlgorithmSpec("fedavg", fedavg.fedavg, fedavg.AcceleratedParams, ("none",)),
    AlgorithmSpec("dp_fedavg_local", fedavg.dp_fedavg_local, fedavg.FedAvgParams, ("dpsgd",)),
    AlgorithmSpec("dp_fedavg_central", fedavg.dp_fedavg_central, fedavg.CentralParams, ("central",)),
    AlgorithmSpec("udp_fedavg", fedavg.udp_fedavg, fedavg.FedAvgParams, ("udp",)),
    AlgorithmSpec("noisy_fedavg", noisy.noisy_fedavg, noisy.NoisyParams, noisy.MECHANISMS),
    AlgorithmSpec("noisy_fedprox", noisy.noisy_fedprox, noisy.NoisyProxParams, noisy.MECHANISMS),
    AlgorithmSpec("fedprox", fedavg.fedprox, fedavg.ProxParams, ("none", "dpsgd")),
    AlgorithmSpec("weiavg", weighted.weiavg, fedavg.CentralParams, weighted.MECHANISMS),
    AlgorithmSpec("min_eps", weighted.min_eps, weighted.EpsTargetParams, weighted.MECHANISMS),
    AlgorithmSpec("max_eps", weighted.max_eps, weighted.EpsTargetParams, weighted.MECHANISMS),
    AlgorithmSpec("oracle", weighted.oracle, fedavg.CentralParams, weighted.MECHANISMS),
    AlgorithmSpec("pfa", pfa.pfa, pfa.PFAParams, pfa.MECHANISMS),
    AlgorithmSpec("pfa_plus", pfa.pfa_plus, pfa.PFAPlusParams, pfa.MECHANISMS),
    AlgorithmSpec("robust_hdp", robust_hdp.robust_hdp, robust_hdp.RobustHDPParams, robust_hdp.MECHANISMS),
    AlgorithmSpec("fedceo", fedceo.fedceo, fedceo.FedCEOParams, fedceo.MECHANISMS),
    AlgorithmSpec("ppsgd", personal.ppsgd, personal.PPSGDParams, personal.MECHANISMS),
    AlgorithmSpec("centaur", personal.centaur, personal.CentaurParams, personal.MECHANISMS),
    AlgorithmSpec("fedsplit", splitting.fedsplit, splitting.SplittingParams, splitting.MECHANISMS),
    AlgorithmSpec("fedpi", splitting.fedpi, splitting.SplittingParams, splitting.MECHANISMS),
    AlgorithmSpec("fedrp", splitting.fedrp, splitting.SplittingParams, splitting.MECHANISMS),
    # built with their data: they return a ClusteredBuild (the bundle and each client's calibrated noise)
    AlgorithmSpec("rdpcfl", clustered.rdpcfl, clustered.RDPCFLParams, clustered.MECHANISMS, with_data=True),
    AlgorithmSpec("ifca_dp", clustered.ifca_dp, clustered.IFCAParams, clustered.MECHANISMS, with_data=True),
    AlgorithmSpec("clustered_oracle", clustered.clustered_oracle, clustered.ClusteredParams, clustered.MECHANISMS,
                  with_data=True),
    AlgorithmSpec("clustered_local", clustered.clustered_local, clustered.ClusteredParams, clustered.MECHANISMS,
                  with_data=True),
    AlgorithmSpec("mr_mtl", clustered.mr_mtl, clustered.MRMTLParams, clustered.MECHANISMS, with_data=True),
    # MP-DP and its baselines: FedSGD in float64 on the run's network (they read the built model)
    AlgorithmSpec("mpdp", mpdp.mpdp, mpdp.MPDPParams, ("mpdp",)),
    AlgorithmSpec("mpdp_naive", mpdp.mpdp_naive, mpdp.MPDPParams, ("mpdp",)),
    AlgorithmSpec("mp_cdp", mpdp.mp_cdp, mpdp.MPDPParams, ("mpdp_central",)),
    AlgorithmSpec("tp_smc", mpdp.tp_smc, mpdp.MPDPParams, ("mpdp_central",)),
    AlgorithmSpec("fedsgd", mpdp.fedsgd, mpdp.MPDPParams, ("none",)),
)
