from radixjobs.cli import main

main()
