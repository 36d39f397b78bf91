from scalerl.cli import app

app()
