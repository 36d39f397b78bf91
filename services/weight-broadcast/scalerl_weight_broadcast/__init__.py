"""ScaleRL weight-broadcast: fan-out of policy weights to generators"""
