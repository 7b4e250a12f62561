// tools/demo/mlp.cpp — the MLP's forward and backward passes (cblas_sgemm) and the double-precision reference loss.
#include "mlp.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

namespace shardopt_demo {

double Mlp::forward_backward(const std::vector<LinearTensors>& net, const float* input,
                             const float* target, const std::function<void(int)>& layer_done,
                             const std::function<void(int)>& before_layer) {
  const int n = width_;
  const int b = batch_;
  const std::size_t elems = static_cast<std::size_t>(b) * n;
  std::copy(input, input + elems, activations_[0].begin());
  for (int l = 0; l < layers_; ++l) {
    if (before_layer) before_layer(l);
    const float* x = activations_[l].data();
    float* y = activations_[l + 1].data();
    // y = x W^T + bias: start from the bias in every row, then accumulate the product.
    for (int r = 0; r < b; ++r) std::copy(net[l].bias, net[l].bias + n, y + static_cast<std::size_t>(r) * n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, n, n, 1.0f, x, n, net[l].weight, n,
                1.0f, y, n);
    if (l + 1 < layers_) {
      for (std::size_t i = 0; i < elems; ++i) y[i] = std::max(y[i], 0.0f);
    }
  }

  // loss = mean((y - t)^2), so d loss / d y = 2 (y - t) / (batch * width).
  const float* out = activations_[layers_].data();
  const double scale = 2.0 / static_cast<double>(elems);
  double loss = 0.0;
  for (std::size_t i = 0; i < elems; ++i) {
    const double diff = static_cast<double>(out[i]) - static_cast<double>(target[i]);
    loss += diff * diff;
    grad_out_[i] = static_cast<float>(scale * diff);
  }
  loss /= static_cast<double>(elems);

  for (int l = layers_ - 1; l >= 0; --l) {
    const float* x = activations_[l].data();
    const float* dy = grad_out_.data();
    // dW = dY^T X   ([out x batch] . [batch x in])
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, n, b, 1.0f, dy, n, x, n, 0.0f,
                net[l].weight_grad, n);
    // dbias = column sums of dY
    float* db = net[l].bias_grad;
    std::fill(db, db + n, 0.0f);
    for (int r = 0; r < b; ++r) {
      const float* row = dy + static_cast<std::size_t>(r) * n;
      for (int j = 0; j < n; ++j) db[j] += row[j];
    }
    if (l == 0) {  // nobody needs the gradient of the input
      if (layer_done) layer_done(l);
      break;
    }
    // dX = dY W   ([batch x out] . [out x in]), then through the previous ReLU: x > 0
    // exactly where its pre-activation was > 0.
    float* dx = grad_in_.data();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, n, n, 1.0f, dy, n, net[l].weight,
                n, 0.0f, dx, n);
    for (std::size_t i = 0; i < elems; ++i) {
      if (!(x[i] > 0.0f)) dx[i] = 0.0f;
    }
    // Only now, with dX computed, is layer l's weight no longer read: an optimizer that
    // updates a bucket as soon as its gradients are reduced (overlap per_bucket) may write
    // the new values from here on, on this rank or (shared parameters) from a peer.
    if (layer_done) layer_done(l);
    std::swap(grad_out_, grad_in_);
  }
  return loss;
}

double reference_loss(int layers, int width, int batch, const std::vector<std::vector<double>>& weights,
                      const std::vector<std::vector<double>>& biases, const std::vector<float>& input,
                      const std::vector<float>& target) {
  const std::size_t n = static_cast<std::size_t>(width);
  std::vector<double> x(input.begin(), input.end());
  std::vector<double> y(x.size());
  for (int l = 0; l < layers; ++l) {
    for (int r = 0; r < batch; ++r) {
      for (std::size_t o = 0; o < n; ++o) {
        double acc = biases[l][o];
        for (std::size_t i = 0; i < n; ++i) acc += x[r * n + i] * weights[l][o * n + i];
        y[r * n + o] = (l + 1 < layers) ? std::max(acc, 0.0) : acc;
      }
    }
    std::swap(x, y);
  }
  double loss = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double diff = x[i] - static_cast<double>(target[i]);
    loss += diff * diff;
  }
  return loss / static_cast<double>(x.size());
}

}  // namespace shardopt_demo
