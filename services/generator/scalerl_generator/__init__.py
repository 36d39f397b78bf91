"""ScaleRL generator: vLLM rollouts with in-flight weight updates"""
