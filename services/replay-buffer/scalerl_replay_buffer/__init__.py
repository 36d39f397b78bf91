"""ScaleRL replay-buffer: prompt pool and scored-group streams on Redis"""
