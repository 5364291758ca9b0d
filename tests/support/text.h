// Text the tests read back: a file's bytes, the message of a vxq::Error.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "core/error.h"

namespace vxq::test {

// The whole file, bytes as stored ("" when it cannot be opened).
inline std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The message of the vxq::Error that fn throws; "" when it throws none.
inline std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace vxq::test
