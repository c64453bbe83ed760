#include "larder/core/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace larder {

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return not_found(strfmt("[mmap] %s: file not found", path.c_str()));
    return io_error(strfmt("[mmap] %s: cannot open: %s", path.c_str(), std::strerror(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return io_error(strfmt("[mmap] %s: fstat failed: %s", path.c_str(), std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(strfmt("[mmap] %s: not a regular file", path.c_str()));
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return io_error(strfmt("[mmap] %s: mmap of %zu bytes failed: %s", path.c_str(), f->size_,
                             std::strerror(e)));
    }
    f->data_ = static_cast<uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return f;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

void MappedFile::advise_willneed(size_t offset, size_t length) const {
  if (!data_ || offset >= size_) return;
  long page = ::sysconf(_SC_PAGESIZE);
  size_t start = offset & ~static_cast<size_t>(page - 1);
  size_t end = std::min(size_, offset + length);
  ::madvise(data_ + start, end - start, MADV_WILLNEED);
}

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!file_exists(path)) return not_found(strfmt("[io] %s: file not found", path.c_str()));
    return io_error(strfmt("[io] %s: cannot open: %s", path.c_str(), std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(strfmt("[io] %s: read failed", path.c_str()));
  return ss.str();
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace larder
