// tools/demo/mlp.hpp — shardopt-demo's model: an MLP's forward/backward over OpenBLAS, and a plain reference loss.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace shardopt_demo {

// Where one Linear layer's tensors live right now (shardopt's bucket views or our buffers).
// Weights are [out x in] row-major, as torch stores them.
struct LinearTensors {
  float* weight = nullptr;
  float* bias = nullptr;
  float* weight_grad = nullptr;
  float* bias_grad = nullptr;
};

// Forward and backward of Linear -> ReLU -> ... -> Linear with an MSE loss, all layers
// width x width. Activations are kept per layer for the backward pass.
class Mlp {
 public:
  Mlp(int layers, int width, int batch)
      : layers_(layers), width_(width), batch_(batch),
        activations_(static_cast<std::size_t>(layers) + 1,
                     std::vector<float>(static_cast<std::size_t>(batch) * width)),
        grad_out_(static_cast<std::size_t>(batch) * width),
        grad_in_(static_cast<std::size_t>(batch) * width) {}

  // Returns the mean squared error of the output against `target` and overwrites (does not
  // accumulate into) every layer's weight_grad/bias_grad with d loss / d param. `layer_done`
  // (if set) is called with l as soon as layer l's gradients are complete and its parameters
  // are no longer read (after the input gradient through it), in backward order (last layer
  // first), like a backward hook; it may consume them and let the next layer reuse the same
  // gradient buffers, and the optimizer may update that layer's parameters from then on. `before_layer` (if set) is called with l just before
  // layer l's forward reads its weight and bias, in forward order: an overlapped optimizer
  // waits there for that layer's parameters (wait_param) while later layers still travel.
  double forward_backward(const std::vector<LinearTensors>& net, const float* input,
                          const float* target, const std::function<void(int)>& layer_done = {},
                          const std::function<void(int)>& before_layer = {});

 private:
  int layers_;
  int width_;
  int batch_;
  std::vector<std::vector<float>> activations_;  // [0] input, [l+1] output of layer l
  std::vector<float> grad_out_;
  std::vector<float> grad_in_;
};

// The same network's loss in double with plain loops: an independent reference for the
// gradient check (it shares no code with the BLAS path).
double reference_loss(int layers, int width, int batch, const std::vector<std::vector<double>>& weights,
                      const std::vector<std::vector<double>>& biases, const std::vector<float>& input,
                      const std::vector<float>& target);

}  // namespace shardopt_demo
