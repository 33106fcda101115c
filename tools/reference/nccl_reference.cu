// Raw-NCCL reference for gpuval's collectives: the same ops, sizes and bandwidth formulas, timed the way
// nccl-tests times them (back-to-back launches between two events, time averaged over GPUs), with no
// Python and no torch.distributed in the path. Two modes, as nccl-tests has: one process driving every
// local GPU (its default, `-g N`), or one process per GPU (nccl-tests under MPI; torch's layout too):
// set NCCL_REF_NRANKS, NCCL_REF_RANK and NCCL_REF_ID_FILE in each process (nccl_reference_mp.sh does);
// rank 0 writes the ncclUniqueId to the file, the others read it, and rank 0 alone prints, timing its GPU. nccl-tests itself cannot
// be fetched onto the lent machines; this harness shows what NCCL alone gives on the same machine, so
// gpuval's overhead can be read off as the ratio.
//
// Build: nvcc -O2 -std=c++17 -arch=sm_90 -I$NCCL/include nccl_reference.cu -o nccl_reference
//        -L$NCCL/lib -l:libnccl.so.2
// Run:   nccl_reference OP MIN_BYTES MAX_BYTES [FACTOR=2] [ITERS=20] [WARMUP=5] [REPEATS=5]
// Output: one JSON object per size on stdout.
//
// Bandwidths follow nccl-tests doc/PERFORMANCE.md: algbw = S / t; busbw = algbw * factor(n) with
// factor 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and alltoall, 1 otherwise.

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#define CUDA_OK(cmd)                                                                            \
  do {                                                                                          \
    cudaError_t cuda_error_ = (cmd);                                                                    \
    if (cuda_error_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d CUDA error %s\n", __FILE__, __LINE__, cudaGetErrorString(cuda_error_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)
#define NCCL_OK(cmd)                                                                            \
  do {                                                                                          \
    ncclResult_t nccl_result_ = (cmd);                                                                   \
    if (nccl_result_ != ncclSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d NCCL error %s\n", __FILE__, __LINE__, ncclGetErrorString(nccl_result_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

struct Rank {
  int rank;  // global rank in the communicator
  int device;
  ncclComm_t comm;
  cudaStream_t stream;
  float* send;
  float* recv;
  cudaEvent_t start, stop;
};

static double busbw_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "alltoall") return double(n - 1) / n;
  return 1.0;
}

// Launch one op on every GPU. `count` is S in floats, a multiple of n.
static void launch(const std::string& op, std::vector<Rank>& ranks, size_t count, int n) {
  const size_t chunk = count / n;
  NCCL_OK(ncclGroupStart());
  for (Rank& k : ranks) {
    const int r = k.rank;
    if (op == "all_reduce") {
      NCCL_OK(ncclAllReduce(k.send, k.recv, count, ncclFloat, ncclSum, k.comm, k.stream));
    } else if (op == "all_gather") {  // S = whole output
      NCCL_OK(ncclAllGather(k.send, k.recv, chunk, ncclFloat, k.comm, k.stream));
    } else if (op == "reduce_scatter") {  // S = whole input
      NCCL_OK(ncclReduceScatter(k.send, k.recv, chunk, ncclFloat, ncclSum, k.comm, k.stream));
    } else if (op == "alltoall") {  // S = per-rank send buffer, one chunk to each peer
      for (int peer = 0; peer < n; ++peer) {
        NCCL_OK(ncclSend(k.send + peer * chunk, chunk, ncclFloat, peer, k.comm, k.stream));
        NCCL_OK(ncclRecv(k.recv + peer * chunk, chunk, ncclFloat, peer, k.comm, k.stream));
      }
    } else if (op == "broadcast") {
      NCCL_OK(ncclBroadcast(k.send, k.recv, count, ncclFloat, 0, k.comm, k.stream));
    } else if (op == "sendrecv") {  // ring: send to r+1, receive from r-1
      NCCL_OK(ncclSend(k.send, count, ncclFloat, (r + 1) % n, k.comm, k.stream));
      NCCL_OK(ncclRecv(k.recv, count, ncclFloat, (r - 1 + n) % n, k.comm, k.stream));
    } else {
      std::fprintf(stderr, "unknown op %s\n", op.c_str());
      std::exit(2);
    }
  }
  NCCL_OK(ncclGroupEnd());
}

__global__ void fill(float* data, size_t count, int rank) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i < count; i += size_t(gridDim.x) * blockDim.x) data[i] = float((i * 3 + rank * 11) % 61 + 1);
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s OP MIN_BYTES MAX_BYTES [FACTOR] [ITERS] [WARMUP] [REPEATS]\n", argv[0]);
    return 2;
  }
  const std::string op = argv[1];
  const size_t min_bytes = std::strtoull(argv[2], nullptr, 10);
  const size_t max_bytes = std::strtoull(argv[3], nullptr, 10);
  const size_t factor = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 2;
  const int iters = argc > 5 ? std::atoi(argv[5]) : 20;
  const int warmup = argc > 6 ? std::atoi(argv[6]) : 5;
  const int repeats = argc > 7 ? std::atoi(argv[7]) : 5;

  int n = 0;
  std::vector<Rank> ranks;
  const char* nranks_env = std::getenv("NCCL_REF_NRANKS");
  if (nranks_env) {  // one process per GPU
    n = std::atoi(nranks_env);
    const int me = std::atoi(std::getenv("NCCL_REF_RANK"));
    const std::string id_file = std::getenv("NCCL_REF_ID_FILE");
    ncclUniqueId id;
    if (me == 0) {
      NCCL_OK(ncclGetUniqueId(&id));
      const std::string temp = id_file + ".tmp";
      FILE* out = std::fopen(temp.c_str(), "wb");
      std::fwrite(&id, sizeof(id), 1, out);
      std::fclose(out);
      std::rename(temp.c_str(), id_file.c_str());  // readers never see half an id
    } else {
      FILE* in = nullptr;
      while (!(in = std::fopen(id_file.c_str(), "rb"))) usleep(10000);
      if (std::fread(&id, sizeof(id), 1, in) != 1) return 1;
      std::fclose(in);
    }
    CUDA_OK(cudaSetDevice(me));
    Rank k{};
    k.rank = me;
    k.device = me;
    NCCL_OK(ncclCommInitRank(&k.comm, n, id, me));
    ranks.push_back(k);
  } else {  // one process, every local GPU
    CUDA_OK(cudaGetDeviceCount(&n));
    std::vector<int> devices(n);
    for (int i = 0; i < n; ++i) devices[i] = i;
    std::vector<ncclComm_t> comms(n);
    NCCL_OK(ncclCommInitAll(comms.data(), n, devices.data()));
    for (int r = 0; r < n; ++r) ranks.push_back(Rank{r, r, comms[r]});
  }
  const bool prints = ranks.front().rank == 0;

  for (Rank& k : ranks) {
    const int r = k.rank;
    CUDA_OK(cudaSetDevice(k.device));
    CUDA_OK(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc(&k.send, max_bytes));
    CUDA_OK(cudaMalloc(&k.recv, max_bytes));
    fill<<<1024, 256, 0, k.stream>>>(k.send, max_bytes / sizeof(float), r);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaEventCreate(&k.start));
    CUDA_OK(cudaEventCreate(&k.stop));
  }

  for (size_t size = min_bytes; size <= max_bytes; size *= factor) {
    size_t count = size / sizeof(float);
    count -= count % n;  // nccl-tests rounds S down to a multiple of n elements
    for (int i = 0; i < warmup; ++i) launch(op, ranks, count, n);
    for (auto& k : ranks) CUDA_OK(cudaStreamSynchronize(k.stream));
    std::vector<double> block_us;
    for (int rep = 0; rep < repeats; ++rep) {
      for (auto& k : ranks) {
        CUDA_OK(cudaSetDevice(k.device));
        CUDA_OK(cudaEventRecord(k.start, k.stream));
      }
      for (int i = 0; i < iters; ++i) launch(op, ranks, count, n);
      double sum_ms = 0.0;
      for (auto& k : ranks) {
        CUDA_OK(cudaSetDevice(k.device));
        CUDA_OK(cudaEventRecord(k.stop, k.stream));
      }
      for (auto& k : ranks) {
        CUDA_OK(cudaEventSynchronize(k.stop));
        float ms = 0.0f;
        CUDA_OK(cudaEventElapsedTime(&ms, k.start, k.stop));
        sum_ms += ms;
      }
      // averaged over this process's GPUs, as nccl-tests' default -a 1 (one GPU per process: rank 0's)
      block_us.push_back(sum_ms / ranks.size() / iters * 1e3);
    }
    std::sort(block_us.begin(), block_us.end());
    const double median_us = block_us.size() % 2 ? block_us[block_us.size() / 2]
                                                 : (block_us[block_us.size() / 2 - 1] + block_us[block_us.size() / 2]) / 2;
    const double bytes = double(count) * sizeof(float);
    const double algbw = bytes / (median_us * 1e-6) / 1e9;
    if (!prints) continue;
    std::printf(
        "{\"op\": \"%s\", \"bytes\": %zu, \"bytes_exact\": %.0f, \"ranks\": %d, \"time_us\": %.3f, "
        "\"time_us_min\": %.3f, \"time_us_max\": %.3f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f}\n",
        op.c_str(), size, bytes, n, median_us, block_us.front(), block_us.back(), algbw,
        algbw * busbw_factor(op, n));
    std::fflush(stdout);
  }
  for (auto& k : ranks) {
    CUDA_OK(cudaSetDevice(k.device));
    CUDA_OK(cudaFree(k.send));
    CUDA_OK(cudaFree(k.recv));
    NCCL_OK(ncclCommDestroy(k.comm));
  }
  return 0;
}
