"""A TD3/DrQ-v2 style JAX agent on Reverb: the workload replaywatch diagnoses.

File roles follow Acme: `config`, `environments`, `networks`, `learning`,
`acting`, `adders`, `replay`, `builder`, then the loops (`local` for sync,
`distributed` for Ray) and the CLI (`run`).
"""
