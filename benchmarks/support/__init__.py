"""What the benchmarks run on, kept outside the test suite (the tests import it too; the
benchmarks never import tests): the real `ortserve` processes (`servers`), a Dockerfile
read without Docker (`dockerfile`), a loopback fake of the Lambda Runtime API
(`lambda_runtime_api`) and the events API Gateway sends (`lambda_events`)."""
