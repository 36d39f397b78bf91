from scalerl.entrypoint import main

main()
