from nodekit.cli.app import main

main()
