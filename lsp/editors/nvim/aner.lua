-- Aner in Neovim (0.10+; no plugins needed). Put this file on your runtimepath, e.g.
--   ~/.config/nvim/plugin/aner.lua
-- It registers the .aner filetype, `#` comments, and starts `aner lsp` for each Aner buffer.
vim.filetype.add({ extension = { aner = "aner" } })

vim.api.nvim_create_autocmd("FileType", {
  pattern = "aner",
  callback = function(args)
    vim.bo[args.buf].commentstring = "# %s"
    vim.lsp.start({
      name = "aner",
      cmd = { "aner", "lsp" },
      root_dir = vim.fs.root(args.buf, { ".git", "pyproject.toml" }) or vim.fn.getcwd(),
    })
  end,
})
