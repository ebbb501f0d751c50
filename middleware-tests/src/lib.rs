//! Tests only (`tests/`): RDMA middleware, unmodified, on rxe-emu devices
//! through `rxe-emu exec`, the way a user runs it; `tests/common` holds
//! the harness.
