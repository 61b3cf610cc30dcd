// CosmoFlow's 3x3x3 convolutions on a CPU by Winograd's F(2x2x2, 3x3x3).
//
// Why: at float32 the reference network's step is its convolutions, and
// oneDNN's direct kernels for its largest blocks already run at the core's
// peak (bench/RESULTS.md, "CosmoFlow's reference network"): only fewer
// multiplications make them faster. Winograd's minimal filtering computes
// each 2x2x2 tile of outputs from its 4x4x4 tile of inputs with 64
// products a pair of channels instead of 8 x 27 = 216 (3.4x fewer). The
// transforms around the products cost memory passes, which is why the
// same algorithm in TensorFlow's ops ran 2.5x slower than oneDNN: here
// they are fused, a block of tiles at a time, so that the transformed
// tiles stay in the core's cache.
//
// Two ops, both on NDHWC float32 volumes of even sides, "same" padding,
// stride 1 (models/winograd3d.py builds the convolution and its gradients
// from them):
//   Winograd3DTransformKernel(kernel [3,3,3,Ci,Co]) -> [64,Ci,Co]: the
//     kernel in Winograd's domain (G g G^T along each axis).
//   Winograd3DConv(input [N,D,H,W,Ci], transformed_kernel [64,Ci,Co])
//     -> [N,D,H,W,Co]: the convolution. With the kernel mirrored and its
//     channels swapped, the same op gives the gradient of the input.
//   Winograd3DKernelGradient(input, output_gradient [N,D,H,W,Co])
//     -> [64,Ci,Co]: the gradient of the transformed kernel.
//   Winograd3DUntransformKernel(gradient [64,Ci,Co]) -> [3,3,3,Ci,Co]: a
//     gradient in Winograd's domain back to the 27 taps (G^T along each
//     axis), the transform's own gradient.
//
// Each sums its products in an order fixed by the shapes and the number
// of shards alone, so a run is reproducible for a given thread count.
#include <algorithm>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// The widest float vector the build's machine has, and how many of them
// a row of the products' register tile holds: 6 x 4 accumulators of 16
// lanes fill 24 of AVX-512's 32 registers, 6 x 2 of 8 lanes 12 of AVX2's
// 16, leaving room for the operands.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kPanel = 4;
#else
constexpr int kLanes = 8;
constexpr int kPanel = 2;
#endif
constexpr int kRows = 6;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
// The transformed tiles of a block, at most this many bytes: about half
// of a core's L2 cache (2 MB on the AVX-512 hosts here). A quarter or
// twice as much ran the second block's ops up to 2x slower.
constexpr long kBlockBytes = 1 << 20;
// The kernel gradient's partial sums, one a shard, at most this many
// bytes (Winograd3DKernelGradientOp).
constexpr long kPartialSumBytes = 256L << 20;

template <typename V>
inline V Load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V>
inline void Store(float* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}
template <typename V>
inline V Zero() {
  return V{} * 0.0f;
}

// A volume's geometry and its 2x2x2 tiles, numbered example-major.
struct Geometry {
  long n, d, h, w;
  long TileCount() const { return n * (d / 2) * (h / 2) * (w / 2); }
  // The tile's first voxel: example, depth, height, width.
  void Origin(long tile, long* e, long* z, long* y, long* x) const {
    const long tw = w / 2, th = h / 2, td = d / 2;
    *x = 2 * (tile % tw);
    tile /= tw;
    *y = 2 * (tile % th);
    tile /= th;
    *z = 2 * (tile % td);
    *e = tile / td;
  }
  long Offset(long e, long z, long y, long x, long channels) const {
    return (((e * d + z) * h + y) * w + x) * channels;
  }
};

// B^T along one axis: the 4 inputs of a tile's line to Winograd's domain.
template <typename V>
inline void InputLine(V& a, V& b, V& c, V& d) {
  const V o0 = a - c, o1 = b + c, o2 = c - b, o3 = b - d;
  a = o0, b = o1, c = o2, d = o3;
}

// A tile's 4x4x4 inputs (its 2x2x2 voxels, one before and one after along
// each axis, zero outside the volume) in Winograd's domain, for channels
// [c, c + lanes of V): to out[p * p_stride] for each of the 64 points p.
template <typename V>
void TransformInputTile(const float* input, const Geometry& g, long channels,
                        long e, long z, long y, long x, long c, float* out,
                        long p_stride) {
  V t[4][4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 4; ++k) {
        const long zz = z - 1 + i, yy = y - 1 + j, xx = x - 1 + k;
        const bool inside = zz >= 0 && zz < g.d && yy >= 0 && yy < g.h &&
                            xx >= 0 && xx < g.w;
        t[i][j][k] = inside ? Load<V>(input + g.Offset(e, zz, yy, xx, channels)
                                      + c)
                            : Zero<V>();
      }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      InputLine(t[i][j][0], t[i][j][1], t[i][j][2], t[i][j][3]);
  for (int i = 0; i < 4; ++i)
    for (int k = 0; k < 4; ++k)
      InputLine(t[i][0][k], t[i][1][k], t[i][2][k], t[i][3][k]);
  for (int j = 0; j < 4; ++j)
    for (int k = 0; k < 4; ++k)
      InputLine(t[0][j][k], t[1][j][k], t[2][j][k], t[3][j][k]);
  for (int p = 0; p < 64; ++p)
    Store<V>(out + p * p_stride, t[p >> 4][(p >> 2) & 3][p & 3]);
}

// Every channel of a tile's inputs, a vector at a time.
void TransformInput(const float* input, const Geometry& g, long channels,
                    long tile, float* out, long p_stride) {
  long e, z, y, x;
  g.Origin(tile, &e, &z, &y, &x);
  for (long c = 0; c < channels; c += kLanes)
    TransformInputTile<Vec>(input, g, channels, e, z, y, x, c, out + c,
                            p_stride);
}

// A^T along one axis: 4 points of Winograd's domain to a tile's 2 outputs.
inline void OutputLine(const Vec& a, const Vec& b, const Vec& c, const Vec& d,
                       Vec& o0, Vec& o1) {
  o0 = a + b + c;
  o1 = b - c - d;
}

// A tile's 64 points (in[p * p_stride]) back to its 2x2x2 outputs.
void TransformOutput(const float* in, long p_stride, const Geometry& g,
                     long channels, long tile, float* output) {
  long e, z, y, x;
  g.Origin(tile, &e, &z, &y, &x);
  for (long c = 0; c < channels; c += kLanes) {
    Vec m[4][4][4];
    for (int p = 0; p < 64; ++p)
      m[p >> 4][(p >> 2) & 3][p & 3] = Load<Vec>(in + p * p_stride + c);
    Vec s[4][4][2], r[4][2][2];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        OutputLine(m[i][j][0], m[i][j][1], m[i][j][2], m[i][j][3], s[i][j][0],
                   s[i][j][1]);
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 2; ++k)
        OutputLine(s[i][0][k], s[i][1][k], s[i][2][k], s[i][3][k], r[i][0][k],
                   r[i][1][k]);
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k) {
        Vec o0, o1;
        OutputLine(r[0][j][k], r[1][j][k], r[2][j][k], r[3][j][k], o0, o1);
        Store<Vec>(output + g.Offset(e, z, y + j, x + k, channels) + c, o0);
        Store<Vec>(output + g.Offset(e, z + 1, y + j, x + k, channels) + c,
                   o1);
      }
  }
}

// A's transpose along one axis: a tile's 2 output gradients to the 4
// points' (the gradient of OutputLine).
inline void OutputGradientLine(const Vec& a, const Vec& b, Vec& o0, Vec& o1,
                               Vec& o2, Vec& o3) {
  o0 = a;
  o1 = a + b;
  o2 = a - b;
  o3 = Zero<Vec>() - b;
}

// A tile's 2x2x2 output gradients to its 64 points' (out[p * p_stride]).
void TransformOutputGradient(const float* gradient, const Geometry& g,
                             long channels, long tile, float* out,
                             long p_stride) {
  long e, z, y, x;
  g.Origin(tile, &e, &z, &y, &x);
  for (long c = 0; c < channels; c += kLanes) {
    Vec a[2][2][2];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        for (int k = 0; k < 2; ++k)
          a[i][j][k] =
              Load<Vec>(gradient + g.Offset(e, z + i, y + j, x + k, channels)
                        + c);
    Vec s[2][2][4], r[2][4][4], t[4][4][4];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        OutputGradientLine(a[i][j][0], a[i][j][1], s[i][j][0], s[i][j][1],
                           s[i][j][2], s[i][j][3]);
    for (int i = 0; i < 2; ++i)
      for (int k = 0; k < 4; ++k)
        OutputGradientLine(s[i][0][k], s[i][1][k], r[i][0][k], r[i][1][k],
                           r[i][2][k], r[i][3][k]);
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 4; ++k)
        OutputGradientLine(r[0][j][k], r[1][j][k], t[0][j][k], t[1][j][k],
                           t[2][j][k], t[3][j][k]);
    for (int p = 0; p < 64; ++p)
      Store<Vec>(out + p * p_stride + c, t[p >> 4][(p >> 2) & 3][p & 3]);
  }
}

// The products' register tile: R rows of NV vectors of C, over K terms:
// C[r][v] (+)= sum_k a[r * a_row + k * a_term] * b[k * b_term + v lanes].
template <int R, int NV, bool kAccumulate>
inline void Products(const float* a, long a_row, long a_term, const float* b,
                     long b_term, long terms, float* c, long c_row) {
  Vec acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = kAccumulate ? Load<Vec>(c + r * c_row + v * kLanes)
                              : Zero<Vec>();
  for (long k = 0; k < terms; ++k) {
    Vec bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = Load<Vec>(b + k * b_term + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const float ar = a[r * a_row + k * a_term];
      for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) Store<Vec>(c + r * c_row + v * kLanes, acc[r][v]);
}

template <int R, bool kAccumulate>
inline void ProductsOfRows(int vectors, const float* a, long a_row,
                           long a_term, const float* b, long b_term,
                           long terms, float* c, long c_row) {
  switch (vectors) {
    case 1: return Products<R, 1, kAccumulate>(a, a_row, a_term, b, b_term, terms, c, c_row);
    case 2: return Products<R, 2, kAccumulate>(a, a_row, a_term, b, b_term, terms, c, c_row);
#if defined(__AVX512F__)
    // (Rows of 3 or 4 vectors come kRows at a time: more would spill.)
    case 3: if constexpr (R <= kRows) return Products<R, 3, kAccumulate>(a, a_row, a_term, b, b_term, terms, c, c_row);
      break;
    case 4: if constexpr (R <= kRows) return Products<R, 4, kAccumulate>(a, a_row, a_term, b, b_term, terms, c, c_row);
      break;
#endif
  }
}

// C (rows x columns, row-major, c_row apart) (+)= A B: A's element (r, k)
// at a[r * a_row + k * a_term], B row-major (b_term apart), columns a
// multiple of kLanes.
template <bool kAccumulate>
void MatrixProduct(long rows, long columns, long terms, const float* a,
                   long a_row, long a_term, const float* b, long b_term,
                   float* c, long c_row) {
  for (long col = 0; col < columns; col += kPanel * kLanes) {
    const int vectors = std::min<long>(kPanel, (columns - col) / kLanes);
    long r = 0;
    // Rows of half a panel or less come twice as many at a time: the same
    // accumulators, half the loads of B a product (the input gradient of
    // the second block has 32 output channels).
    if (2 * vectors <= kPanel)
      for (; r + 2 * kRows <= rows; r += 2 * kRows)
        ProductsOfRows<2 * kRows, kAccumulate>(
            vectors, a + r * a_row, a_row, a_term, b + col, b_term, terms,
            c + r * c_row + col, c_row);
    for (; r < rows; r += kRows) {
      const float* ar = a + r * a_row;
      float* cr = c + r * c_row + col;
      switch (std::min<long>(kRows, rows - r)) {
        case 6: ProductsOfRows<6, kAccumulate>(vectors, ar, a_row, a_term, b + col, b_term, terms, cr, c_row); break;
        case 5: ProductsOfRows<5, kAccumulate>(vectors, ar, a_row, a_term, b + col, b_term, terms, cr, c_row); break;
        case 4: ProductsOfRows<4, kAccumulate>(vectors, ar, a_row, a_term, b + col, b_term, terms, cr, c_row); break;
        case 3: ProductsOfRows<3, kAccumulate>(vectors, ar, a_row, a_term, b + col, b_term, terms, cr, c_row); break;
        case 2: ProductsOfRows<2, kAccumulate>(vectors, ar, a_row, a_term, b + col, b_term, terms, cr, c_row); break;
        case 1: ProductsOfRows<1, kAccumulate>(vectors, ar, a_row, a_term, b + col, b_term, terms, cr, c_row); break;
      }
    }
  }
}

// Tiles in a block whose transformed inputs and outputs take at most
// kBlockBytes, a multiple of kRows (the products' row tile).
long TilesPerBlock(long in_channels, long out_channels) {
  const long per_tile = 64 * (in_channels + out_channels) * sizeof(float);
  return std::max<long>(kRows, kBlockBytes / per_tile / kRows * kRows);
}

// The kernels move channels a vector at a time: both counts a multiple of
// its lanes, or the context's status an error. (CosmoFlow's blocks from
// the second have 32 x 2^i filters; its first, 4 channels in, is
// convolved directly.)
void CheckChannels(OpKernelContext* context, long in, long out) {
  OP_REQUIRES(context, in % kLanes == 0 && out % kLanes == 0,
              tensorflow::errors::InvalidArgument(
                  "Winograd3D: channels in and out must be multiples of ",
                  kLanes, "; got ", in, " and ", out));
}

// The volume's geometry, or the context's status an error.
void GeometryOf(OpKernelContext* context, const Tensor& volume, Geometry* g) {
  OP_REQUIRES(context, volume.dims() == 5,
              tensorflow::errors::InvalidArgument(
                  "Winograd3D: volumes are [N, D, H, W, C]; got ",
                  volume.shape().DebugString()));
  *g = Geometry{volume.dim_size(0), volume.dim_size(1), volume.dim_size(2),
                volume.dim_size(3)};
  OP_REQUIRES(context, g->d % 2 == 0 && g->h % 2 == 0 && g->w % 2 == 0,
              tensorflow::errors::InvalidArgument(
                  "Winograd3D: the volume's sides must be even (2x2x2 "
                  "tiles); got ", volume.shape().DebugString()));
}

// G along one axis: a kernel's 3 taps to Winograd's 4 points (0, 1, -1,
// infinity), and its transpose back.
template <typename V>
inline void KernelLine(const V& a, const V& b, const V& c, V& o0, V& o1,
                       V& o2, V& o3) {
  o0 = a;
  o1 = 0.5f * (a + b + c);
  o2 = 0.5f * (a - b + c);
  o3 = c;
}
template <typename V>
inline void KernelGradientLine(const V& a, const V& b, const V& c, const V& d,
                               V& o0, V& o1, V& o2) {
  o0 = a + 0.5f * (b + c);
  o1 = 0.5f * (b - c);
  o2 = d + 0.5f * (b + c);
}

// For the channel pairs [j, j + lanes of V) of a [taps..., pairs] tensor.
template <typename V>
void TransformKernelPairs(const float* kernel, long pairs, long j,
                          float* out) {
  V g[3][3][3], s[3][3][4], r[3][4][4], t[4][4][4];
  for (int i = 0; i < 27; ++i)
    g[i / 9][(i / 3) % 3][i % 3] = Load<V>(kernel + i * pairs + j);
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 3; ++k)
      KernelLine(g[i][k][0], g[i][k][1], g[i][k][2], s[i][k][0], s[i][k][1],
                 s[i][k][2], s[i][k][3]);
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 4; ++c)
      KernelLine(s[i][0][c], s[i][1][c], s[i][2][c], r[i][0][c], r[i][1][c],
                 r[i][2][c], r[i][3][c]);
  for (int b = 0; b < 4; ++b)
    for (int c = 0; c < 4; ++c)
      KernelLine(r[0][b][c], r[1][b][c], r[2][b][c], t[0][b][c], t[1][b][c],
                 t[2][b][c], t[3][b][c]);
  for (int p = 0; p < 64; ++p)
    Store<V>(out + p * pairs + j, t[p >> 4][(p >> 2) & 3][p & 3]);
}

template <typename V>
void UntransformKernelPairs(const float* gradient, long pairs, long j,
                            float* out) {
  V t[4][4][4], r[3][4][4], s[3][3][4], g[3][3][3];
  for (int p = 0; p < 64; ++p)
    t[p >> 4][(p >> 2) & 3][p & 3] = Load<V>(gradient + p * pairs + j);
  for (int b = 0; b < 4; ++b)
    for (int c = 0; c < 4; ++c)
      KernelGradientLine(t[0][b][c], t[1][b][c], t[2][b][c], t[3][b][c],
                         r[0][b][c], r[1][b][c], r[2][b][c]);
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 4; ++c)
      KernelGradientLine(r[i][0][c], r[i][1][c], r[i][2][c], r[i][3][c],
                         s[i][0][c], s[i][1][c], s[i][2][c]);
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 3; ++k)
      KernelGradientLine(s[i][k][0], s[i][k][1], s[i][k][2], s[i][k][3],
                         g[i][k][0], g[i][k][1], g[i][k][2]);
  for (int i = 0; i < 27; ++i)
    Store<V>(out + i * pairs + j, g[i / 9][(i / 3) % 3][i % 3]);
}

// Both directions between [27, pairs] taps and [64, pairs] points, the
// pairs (in x out channels) contiguous, a vector of them at a time.
class KernelTransformOp : public OpKernel {
 public:
  KernelTransformOp(OpKernelConstruction* context, bool to_points)
      : OpKernel(context), to_points_(to_points) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& in = context->input(0);
    const int rank = to_points_ ? 5 : 3;
    const long taps = to_points_ ? 27 : 64;
    OP_REQUIRES(context,
                in.dims() == rank &&
                    (to_points_ ? in.dim_size(0) == 3 && in.dim_size(1) == 3 &&
                                      in.dim_size(2) == 3
                                : in.dim_size(0) == 64),
                tensorflow::errors::InvalidArgument(
                    to_points_ ? "Winograd3DTransformKernel: the kernel is "
                                 "[3, 3, 3, Ci, Co]; got "
                               : "Winograd3DUntransformKernel: the gradient "
                                 "is [64, Ci, Co]; got ",
                    in.shape().DebugString()));
    const long in_channels = in.dim_size(rank - 2);
    const long out_channels = in.dim_size(rank - 1);
    CheckChannels(context, in_channels, out_channels);
    if (!context->status().ok()) return;
    const long pairs = in.NumElements() / taps;
    Tensor* out = nullptr;
    const TensorShape shape =
        to_points_ ? TensorShape({64, in_channels, out_channels})
                   : TensorShape({3, 3, 3, in_channels, out_channels});
    OP_REQUIRES_OK(context, context->allocate_output(0, shape, &out));
    const float* a = in.flat<float>().data();
    float* b = out->flat<float>().data();
    for (long j = 0; j < pairs; j += kLanes)
      to_points_ ? TransformKernelPairs<Vec>(a, pairs, j, b)
                 : UntransformKernelPairs<Vec>(a, pairs, j, b);
  }

 private:
  const bool to_points_;
};

class Winograd3DTransformKernelOp : public KernelTransformOp {
 public:
  explicit Winograd3DTransformKernelOp(OpKernelConstruction* context)
      : KernelTransformOp(context, true) {}
};

class Winograd3DUntransformKernelOp : public KernelTransformOp {
 public:
  explicit Winograd3DUntransformKernelOp(OpKernelConstruction* context)
      : KernelTransformOp(context, false) {}
};

class Winograd3DConvOp : public OpKernel {
 public:
  explicit Winograd3DConvOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    const Tensor& kernel = context->input(1);
    Geometry g;
    GeometryOf(context, input, &g);
    if (!context->status().ok()) return;
    const long in_channels = input.dim_size(4);
    OP_REQUIRES(context,
                kernel.dims() == 3 && kernel.dim_size(0) == 64 &&
                    kernel.dim_size(1) == in_channels,
                tensorflow::errors::InvalidArgument(
                    "Winograd3DConv: the transformed kernel is [64, ",
                    in_channels, ", Co]; got ", kernel.shape().DebugString()));
    const long out_channels = kernel.dim_size(2);
    CheckChannels(context, in_channels, out_channels);
    if (!context->status().ok()) return;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
        0, TensorShape({g.n, g.d, g.h, g.w, out_channels}), &output));
    const float* x = input.flat<float>().data();
    const float* u = kernel.flat<float>().data();
    float* y = output->flat<float>().data();
    const long tiles = g.TileCount();
    const long block = TilesPerBlock(in_channels, out_channels);
    const long blocks = (tiles + block - 1) / block;

    auto convolve_blocks = [&](long first, long last) {
      // [64 points][block tiles][channels], for the inputs and the products.
      std::vector<float> v(64 * block * in_channels);
      std::vector<float> m(64 * block * out_channels);
      for (long b = first; b < last; ++b) {
        const long tile0 = b * block;
        const long count = std::min(block, tiles - tile0);
        for (long t = 0; t < count; ++t)
          TransformInput(x, g, in_channels, tile0 + t,
                         v.data() + t * in_channels, block * in_channels);
        for (long p = 0; p < 64; ++p)
          MatrixProduct<false>(count, out_channels, in_channels,
                               v.data() + p * block * in_channels,
                               in_channels, 1,
                               u + p * in_channels * out_channels,
                               out_channels,
                               m.data() + p * block * out_channels,
                               out_channels);
        for (long t = 0; t < count; ++t)
          TransformOutput(m.data() + t * out_channels, block * out_channels, g,
                          out_channels, tile0 + t, y);
      }
    };
    const auto& workers = *context->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(workers.num_threads, workers.workers, blocks,
                      block * 64 * in_channels * out_channels * 2,
                      convolve_blocks);
  }
};

class Winograd3DKernelGradientOp : public OpKernel {
 public:
  explicit Winograd3DKernelGradientOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    const Tensor& gradient = context->input(1);
    Geometry g;
    GeometryOf(context, input, &g);
    if (!context->status().ok()) return;
    const long in_channels = input.dim_size(4);
    OP_REQUIRES(context,
                gradient.dims() == 5 && gradient.dim_size(0) == g.n &&
                    gradient.dim_size(1) == g.d &&
                    gradient.dim_size(2) == g.h && gradient.dim_size(3) == g.w,
                tensorflow::errors::InvalidArgument(
                    "Winograd3DKernelGradient: the output gradient's volume "
                    "must be the input's; got ",
                    gradient.shape().DebugString(), " and ",
                    input.shape().DebugString()));
    const long out_channels = gradient.dim_size(4);
    CheckChannels(context, in_channels, out_channels);
    if (!context->status().ok()) return;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
        0, TensorShape({64, in_channels, out_channels}), &output));
    const float* x = input.flat<float>().data();
    const float* dy = gradient.flat<float>().data();
    const long tiles = g.TileCount();
    const long block = TilesPerBlock(in_channels, out_channels);
    const long blocks = (tiles + block - 1) / block;
    const long kernel_size = 64 * in_channels * out_channels;

    // A fixed split of the blocks into shards, each summing into its own
    // kernel gradient (the first into the output), then added in shard
    // order: the same sums for the same thread count, however the shards
    // are scheduled. A shard's gradient is 64 Ci Co floats: 16 MB at 256
    // channels in and out (CosmoFlow's widest block), so at most
    // kPartialSumBytes of them: past that, fewer shards than threads for
    // that block, rather than a gigabyte at 64 threads.
    const auto& workers = *context->device()->tensorflow_cpu_worker_threads();
    const long most_shards = std::max<long>(
        1, kPartialSumBytes / (kernel_size * long(sizeof(float))));
    const long shards = std::max<long>(
        1, std::min<long>({workers.num_threads, blocks, most_shards}));
    float* out = output->flat<float>().data();
    std::fill(out, out + kernel_size, 0.0f);
    std::vector<std::vector<float>> sums(shards - 1,
                                         std::vector<float>(kernel_size));
    auto sum_shards = [&](long first, long last) {
      std::vector<float> v(64 * block * in_channels);
      std::vector<float> w(64 * block * out_channels);
      for (long s = first; s < last; ++s) {
        float* sum = s == 0 ? out : sums[s - 1].data();
        for (long b = blocks * s / shards; b < blocks * (s + 1) / shards;
             ++b) {
          const long tile0 = b * block;
          const long count = std::min(block, tiles - tile0);
          for (long t = 0; t < count; ++t) {
            TransformInput(x, g, in_channels, tile0 + t,
                           v.data() + t * in_channels, block * in_channels);
            TransformOutputGradient(dy, g, out_channels, tile0 + t,
                                    w.data() + t * out_channels,
                                    block * out_channels);
          }
          // For each point: [in, out] += V^T [in, tiles] W [tiles, out].
          for (long p = 0; p < 64; ++p)
            MatrixProduct<true>(in_channels, out_channels, count,
                                v.data() + p * block * in_channels, 1,
                                in_channels,
                                w.data() + p * block * out_channels,
                                out_channels,
                                sum + p * in_channels * out_channels,
                                out_channels);
        }
      }
    };
    tensorflow::Shard(shards, workers.workers, shards,
                      tiles * 64 * in_channels * out_channels * 2 / shards,
                      sum_shards);
    // The shards' sums added to the first's on every thread, a range of
    // the gradient each, in shard order.
    if (shards > 1)
      tensorflow::Shard(workers.num_threads, workers.workers, kernel_size,
                        shards, [&](long first, long last) {
                          for (const auto& sum : sums)
                            for (long i = first; i < last; ++i)
                              out[i] += sum[i];
                        });
  }
};

}  // namespace

REGISTER_OP("Winograd3DTransformKernel")
    .Input("kernel: float")
    .Output("transformed_kernel: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle kernel;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 5, &kernel));
      c->set_output(0, c->MakeShape({64, c->Dim(kernel, 3),
                                     c->Dim(kernel, 4)}));
      return tensorflow::OkStatus();
    });

REGISTER_OP("Winograd3DUntransformKernel")
    .Input("transformed_kernel_gradient: float")
    .Output("kernel_gradient: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle gradient;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &gradient));
      c->set_output(0, c->MakeShape({3, 3, 3, c->Dim(gradient, 1),
                                     c->Dim(gradient, 2)}));
      return tensorflow::OkStatus();
    });

REGISTER_OP("Winograd3DConv")
    .Input("input: float")
    .Input("transformed_kernel: float")
    .Output("output: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle input, kernel, output;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 5, &input));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &kernel));
      TF_RETURN_IF_ERROR(
          c->ReplaceDim(input, 4, c->Dim(kernel, 2), &output));
      c->set_output(0, output);
      return tensorflow::OkStatus();
    });

REGISTER_OP("Winograd3DKernelGradient")
    .Input("input: float")
    .Input("output_gradient: float")
    .Output("transformed_kernel_gradient: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle input, gradient;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 5, &input));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 5, &gradient));
      c->set_output(0, c->MakeShape({64, c->Dim(input, 4),
                                     c->Dim(gradient, 4)}));
      return tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(
    Name("Winograd3DTransformKernel").Device(tensorflow::DEVICE_CPU),
    Winograd3DTransformKernelOp);
REGISTER_KERNEL_BUILDER(
    Name("Winograd3DUntransformKernel").Device(tensorflow::DEVICE_CPU),
    Winograd3DUntransformKernelOp);
REGISTER_KERNEL_BUILDER(
    Name("Winograd3DConv").Device(tensorflow::DEVICE_CPU), Winograd3DConvOp);
REGISTER_KERNEL_BUILDER(
    Name("Winograd3DKernelGradient").Device(tensorflow::DEVICE_CPU),
    Winograd3DKernelGradientOp);
