-- Aner for Neovim (0.10+): filetype detection and the language server, with no plugins needed.
-- Install: copy this file to ~/.config/nvim/plugin/aner.lua (or `dofile()` it from init.lua).
-- The server command can be changed with `vim.g.aner_lsp_cmd = { "python", "-m", "aner_lsp.server" }`.

vim.filetype.add({ extension = { aner = "aner" } })

vim.api.nvim_create_autocmd("FileType", {
  pattern = "aner",
  callback = function(args)
    vim.bo[args.buf].commentstring = "# %s"
    vim.lsp.start({
      name = "aner",
      cmd = vim.g.aner_lsp_cmd or { "aner", "lsp" },
      root_dir = vim.fs.root(args.buf, { ".git", "pyproject.toml" }) or vim.fn.getcwd(),
    })
  end,
})
