"""ScaleRL forecaster: sigmoid compute-performance fits, uncertainty and decisions"""
