from bench.limit_store.run import main

main()
