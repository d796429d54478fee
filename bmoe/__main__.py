from bmoe.cli import run

run()
