from gpuval.cli import main

main()
