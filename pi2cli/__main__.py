from pi2cli.cli import main

main()
