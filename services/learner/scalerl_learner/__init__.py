"""ScaleRL learner: the ScaleRL objective in torch, checkpoints, validation, compute accounting"""
