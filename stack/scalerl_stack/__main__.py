from scalerl_stack.cli import app

app()
