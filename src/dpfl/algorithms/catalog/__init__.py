"""dpfl's algorithms as Python factories: one module per algorithm or family, each holding the params model the
config validates `algorithm.params` with and the factory ``name(run: RunFacts, **params) -> Algorithm`` that
builds the bundle. `builtins` registers them (`dpfl.algorithms.registry`); `dpfl.algorithms.<name>` reaches them.

Adding an algorithm: a module here with its params model (a `validation.Params`) and its factory, and one line in
`builtins.BUILTINS`; a user's algorithm is one `dpfl.algorithms.register_algorithm` call instead.
"""
