"""Reproduce a paper's comparison: every method on the same data, budgets and seeds, one command.

    grid = dpfl.reproduce.robust_hdp.grid("ci")          # Settings x methods x seeds -> validated Jobs
    outcomes = run_jobs(grid.jobs, out)                    # each job -> OUT/runs/<setting>/<method>/seed<k>/
    write_results(grid, outcomes, out)                     # OUT/results.csv, OUT/results.md, OUT/plots/

`jobs` (what a job is, grid expansion), `pfa` and `robust_hdp` (spec heterogeneous_dp.md §7), `fedceo`
(spec fedceo.md §9), `fdp_accuracy` (spec fdp_accounting.md §8; its own results tables), `runner` (sequential,
resumable execution), `tables` (results files), `families` (one invocation of a family's grid: plan, run,
tables, whichever family it is). `fdp_sensitivity` (spec fdp_accounting.md §7) is not a grid: it
trains neighbouring runs in lockstep. The CLI is `dpfl reproduce pfa|robust-hdp|fedceo|fdp-accuracy|
fdp-sensitivity`; docs/papers/reproduce.md describes the tooling, docs/papers/grids.md the grids and what is
reduced.
"""

from dpfl.reproduce.jobs import Grid, Job, Method, Setting

__all__ = ["Grid", "Job", "Method", "Setting"]
