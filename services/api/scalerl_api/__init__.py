"""ScaleRL api: REST job submission, SQL job store, the control plane"""
