from gpuval.cli import run

run()
