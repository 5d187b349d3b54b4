// A FAKE acl/acl.h for tests/npu/test_fake_runtime.py: only the type the generated launch.cpp
// names (aclrtStream, documented as `typedef void* aclrtStream`, hicann/runtime
// docs/api_docs/aclrtStream.md).
#pragma once
typedef void* aclrtStream;
