"""Code generation: a graph becomes the readable source of a DALI `@pipeline_def` (lowering), after
the opt-in rewrites."""
