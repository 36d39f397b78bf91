"""ScaleRL reward-grader: verifiers behind one gRPC interface"""
