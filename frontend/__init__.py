"""HTTP frontend: documented JSON APIs (TGI's `POST /`, …) translated into Triton gRPC calls."""
